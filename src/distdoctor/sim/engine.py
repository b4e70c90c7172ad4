"""Discrete-event execution of a Program: timing, blocking, and what is left when nothing can move.

Algorithm. Every stream is a cursor over its ops. The event queue holds "this stream may try its next op
at time t" (a heap of distinct times, each with a FIFO bucket of streams). A popped stream runs zero-time
ops (record, wait on a recorded event, acquire of a free slot, release) inline and stops at the first op
that takes time or blocks:
- compute: busy for `us`, then back in the queue at t + us;
- wait: parks on the event until a `record` on the same rank (once recorded, an event stays recorded);
- acquire: parks FIFO on the buffer; `release` hands the slot to the first parked acquirer;
- collective: the n-th collective a rank issues on a group joins instance (group, n); the instance starts
  when every member has arrived, and holds every member's stream until start + duration;
- comm_init: creating a communicator is a collective over its members (ncclCommInitRank blocks until every
  member calls it): compiled as the one collective of a synthetic group `init <group>` with those members;
- send/recv: FIFO per (sender, receiver, tag) channel; a pair starts when both are posted and holds both.
  With `p2p.eager_bytes` B > 0 a channel buffers up to B bytes of sent-but-unreceived messages: a send that
  fits (behind no parked send) completes on its own after its transfer time, a recv then takes the oldest
  buffered message; a send that does not fit waits for its receiver (or for room) as above.
Taking events in time order makes "the n-th collective issued" and buffer hand-over follow simulated time;
ties keep scheduling order, so runs are deterministic. When the queue is empty and some stream has ops left,
that is a deadlock; `waitfor.stream_states` then says where each stream stands, for the one wait-for graph
(distdoctor/findings).
A collective instance whose members issue different ops (kind or bytes) is recorded as a mismatch (desync).

The ops arrive compiled (compiled.py): integer codes and ids, durations already computed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from heapq import heappop, heappush

# the op codes and compile_program live in compiled.py; re-exported here, where the readers of a run look
from distdoctor.sim.compiled import (_INST, ACQUIRE, COLLECTIVE, COMPUTE, RECORD, RECV, RELEASE,  # noqa: F401
                                     SEND, WAIT, Compiled, collective_us, compile_program, jittered, p2p_us)


@dataclass
class RunState:
    """What the run leaves behind: per stream cursor and timings, plus the detail the reports draw."""

    compiled: Compiled
    makespan: float
    pc: list[int]
    busy: list[float]
    wait: list[float]
    since: list[float]  # for blocked streams: when they blocked
    inst_of: dict[int, int]  # blocked sid -> instance key of the collective it waits in
    open_instances: dict[int, list]  # instance key -> [remaining, sids, duration, kind id, bytes, first sid, its op]
    coll_count: dict[int, int]  # rank * n_groups + gid -> collectives issued
    peak: list[int]
    busy_union: dict[int, float]  # rank -> time any compute stream was busy (ranks with >1 compute stream)
    spans: list[tuple] | None  # (sid, start, end, op_index, "busy"|"wait"|"blocked")
    comm_log: list[list[list]] | None  # sid -> [[op_index, seq, t_issue, t_start, t_end], ...]
    ops_executed: int
    mismatches: list[tuple]  # (gid, instance, sid, op index, first member's sid and op index)
    crossed: list[tuple] = ()  # p2p pairs whose send and receive name different messages: (sid, idx) x 2

    @property
    def deadlock(self) -> bool:
        return any(p < len(o) for p, o in zip(self.pc, self.compiled.ops))

    def blocked_sids(self) -> list[int]:
        return [s for s, (p, o) in enumerate(zip(self.pc, self.compiled.ops)) if p < len(o)]


def run(compiled: Compiled, detail: bool = False) -> RunState:
    from distdoctor.trace.loaders import gc_paused

    with gc_paused():  # the run allocates a tuple or list per event; none form cycles
        return _run(compiled, detail)


def _run(compiled: Compiled, detail: bool) -> RunState:
    ops, rank_of = compiled.ops, compiled.rank_of
    S, NG = len(ops), len(compiled.group_names)
    gsize = [len(m) for m in compiled.group_members]
    pc, busy, wait, since = [0] * S, [0.0] * S, [0.0] * S, [0.0] * S
    recorded = [False] * len(compiled.event_keys)
    ewaiters: list[list | None] = [None] * len(compiled.event_keys)
    free = list(compiled.capacity)
    cap = compiled.capacity
    peak = [0] * len(cap)
    bwaiters: list[deque] = [deque() for _ in cap]
    sendq: list[deque] = [deque() for _ in compiled.channels]
    recvq: list[deque] = [deque() for _ in compiled.channels]
    chan_n = [[0, 0] for _ in compiled.channels]  # posts so far: sends, recvs (p2p seq numbers)
    eager = compiled.eager_bytes
    mail: list[deque] = [deque() for _ in compiled.channels]  # buffered (bytes, ready time) per channel
    buffered = [0] * len(compiled.channels)
    coll_count: dict[int, int] = {}
    inst: dict[int, list] = {}
    inst_of: dict[int, int] = {}
    mismatches: list[tuple] = []  # (gid, instance, sid, op index, first member's sid and op index)
    crossed: list[tuple] = []  # (send sid, send op index, recv sid, recv op index): named messages that differ
    spans: list[tuple] | None = [] if detail else None
    comm_log = [[] for _ in range(S)] if detail else None
    # Ranks with several compute streams need the union of their busy time for the bubble fraction. Busy
    # intervals always start at the current time, which never decreases, so a running merge suffices.
    by_rank: dict[int, list[int]] = {}
    for s in sorted(compiled.compute_sids):
        by_rank.setdefault(rank_of[s], []).append(s)
    union_ranks = [r for r, ss in by_rank.items() if len(ss) > 1]
    uidx = [-1] * S
    for u, r in enumerate(union_ranks):
        for s in by_rank[r]:
            uidx[s] = u
    cov_s, cov_e, cov = [0.0] * len(union_ranks), [0.0] * len(union_ranks), [0.0] * len(union_ranks)

    def cover(u: int, a: float, b: float) -> None:
        if a >= cov_e[u]:
            cov[u] += cov_e[u] - cov_s[u]
            cov_s[u], cov_e[u] = a, b
        elif b > cov_e[u]:
            cov_e[u] = b

    # Event queue: a heap of distinct times, each with a FIFO bucket of streams. Same-time events run in
    # the order they were scheduled (deterministic), and a symmetric plan with thousands of ranks costs
    # one heap operation per distinct time instead of one per stream.
    times: list[float] = [0.0]
    buckets: dict[float, list[int]] = {0.0: list(range(S))}

    def push(x: float, w: int) -> None:
        b = buckets.get(x)
        if b is None:
            buckets[x] = [w]
            heappush(times, x)
        else:
            b.append(w)

    now = 0.0
    _heappush, _heappop, _get = heappush, heappop, buckets.get
    while times:
        t = _heappop(times)
        now = t
        bucket = buckets[t]
        j = 0
        while j < len(bucket):
            sid = bucket[j]
            j += 1
            sops = ops[sid]
            n = len(sops)
            i = pc[sid]
            while i < n:
                op = sops[i]
                c = op[0]
                if c == COMPUTE:
                    d = op[1]
                    busy[sid] += d
                    if spans is not None:
                        spans.append((sid, t, t + d, i, "busy"))
                    u = uidx[sid]
                    if u >= 0:  # cover(u, t, t + d), inlined: the commonest op
                        if t >= cov_e[u]:
                            cov[u] += cov_e[u] - cov_s[u]
                            cov_s[u], cov_e[u] = t, t + d
                        elif t + d > cov_e[u]:
                            cov_e[u] = t + d
                    i += 1
                    if d > 0:
                        x = t + d
                        b = _get(x)
                        if b is None:
                            buckets[x] = [sid]
                            _heappush(times, x)
                        else:
                            b.append(sid)
                        break
                elif c == RECORD:
                    e = op[1]
                    if not recorded[e]:
                        recorded[e] = True
                        ws = ewaiters[e]
                        if ws:
                            for w in ws:
                                wait[w] += t - since[w]
                                if spans is not None:
                                    spans.append((w, since[w], t, pc[w], "wait"))
                                pc[w] += 1
                                bucket.append(w)
                            ewaiters[e] = None
                    i += 1
                elif c == WAIT:
                    e = op[1]
                    if recorded[e]:
                        i += 1
                        continue
                    if ewaiters[e] is None:
                        ewaiters[e] = []
                    ewaiters[e].append(sid)
                    since[sid] = t
                    break
                elif c == ACQUIRE:
                    b = op[1]
                    if free[b] > 0:
                        free[b] -= 1
                        if cap[b] - free[b] > peak[b]:
                            peak[b] = cap[b] - free[b]
                        i += 1
                        continue
                    bwaiters[b].append(sid)
                    since[sid] = t
                    break
                elif c == RELEASE:
                    b = op[1]
                    q = bwaiters[b]
                    if q:  # hand the slot straight to the first parked acquirer
                        w = q.popleft()
                        wait[w] += t - since[w]
                        if spans is not None:
                            spans.append((w, since[w], t, pc[w], "wait"))
                        pc[w] += 1
                        bucket.append(w)
                    elif free[b] < cap[b]:
                        free[b] += 1
                    i += 1
                elif c == COLLECTIVE:
                    g = op[1]
                    ck = rank_of[sid] * NG + g
                    k = coll_count.get(ck, 0)
                    coll_count[ck] = k + 1
                    ik = g * _INST + k
                    st = inst.get(ik)
                    if st is None:
                        st = inst[ik] = [gsize[g], [], 0.0, op[3], op[4], sid, i]
                    elif op[3] != st[3] or op[4] != st[4]:
                        # the n-th collective on a group is a different op on this member: a desync
                        mismatches.append((g, k, sid, i, st[5], st[6]))
                    st[0] -= 1
                    st[1].append(sid)
                    if op[2] > st[2]:
                        st[2] = op[2]
                    if comm_log is not None:
                        comm_log[sid].append([i, k + 1, t, None, None])
                    if st[0] > 0:
                        since[sid] = t
                        inst_of[sid] = ik
                        break
                    del inst[ik]
                    d = st[2]
                    x = t + d
                    # every member resumes at x: look its bucket up once (x == t is the current bucket)
                    b = _get(x)
                    if b is None:
                        b = buckets[x] = []
                        _heappush(times, x)
                    if detail:
                        for m in st[1]:
                            if m != sid:
                                wait[m] += t - since[m]
                                spans.append((m, since[m], t, pc[m], "wait"))
                                pc[m] += 1
                                del inst_of[m]
                            busy[m] += d
                            spans.append((m, t, x, pc[m] - 1 if m != sid else i, "busy"))
                            rec = comm_log[m][-1]
                            rec[3], rec[4] = t, x
                            if uidx[m] >= 0:
                                cover(uidx[m], t, x)
                            if m != sid:
                                b.append(m)
                    else:
                        for m in st[1]:
                            if m != sid:
                                wait[m] += t - since[m]
                                pc[m] += 1
                                del inst_of[m]
                                b.append(m)
                            busy[m] += d
                            u = uidx[m]
                            if u >= 0:  # cover(u, t, x), inlined
                                if t >= cov_e[u]:
                                    cov[u] += cov_e[u] - cov_s[u]
                                    cov_s[u], cov_e[u] = t, x
                                elif x > cov_e[u]:
                                    cov_e[u] = x
                    i += 1
                    b.append(sid)
                    break
                else:  # SEND / RECV
                    ch = op[1]
                    if c == SEND:
                        mine, other, side = sendq, recvq, 0
                    else:
                        mine, other, side = recvq, sendq, 1
                    chan_n[ch][side] += 1
                    if comm_log is not None:
                        comm_log[sid].append([i, chan_n[ch][side], t, None, None])
                    if eager and (mail[ch] if c == RECV else
                                  not recvq[ch] and not sendq[ch] and buffered[ch] + op[3] <= eager):
                        # eager: a send that fits the channel's buffer completes without its receiver;
                        # a recv takes the oldest buffered message, and the room it frees lets parked
                        # sends that now fit complete too
                        if c == SEND:
                            buffered[ch] += op[3]
                            x = t + op[2]
                            mail[ch].append((op[3], x, sid, i))
                        else:
                            nbytes, ready, ws, wi = mail[ch].popleft()
                            if op[4] != ops[ws][wi][4] and op[4] >= 0 and ops[ws][wi][4] >= 0:
                                crossed.append((ws, wi, sid, i))
                            buffered[ch] -= nbytes
                            x = ready if ready > t else t
                            sq = sendq[ch]
                            while sq and buffered[ch] + ops[sq[0]][pc[sq[0]]][3] <= eager:
                                w = sq.popleft()
                                wop = ops[w][pc[w]]
                                buffered[ch] += wop[3]
                                xw = t + wop[2]
                                mail[ch].append((wop[3], xw, w, pc[w]))
                                wait[w] += t - since[w]
                                busy[w] += wop[2]
                                if spans is not None:
                                    spans.append((w, since[w], t, pc[w], "wait"))
                                    spans.append((w, t, xw, pc[w], "busy"))
                                if comm_log is not None:
                                    rec = comm_log[w][-1]
                                    rec[3], rec[4] = t, xw
                                if uidx[w] >= 0:
                                    cover(uidx[w], t, xw)
                                pc[w] += 1
                                push(xw, w)
                        busy[sid] += x - t
                        if spans is not None:
                            spans.append((sid, t, x, i, "busy"))
                        if comm_log is not None:
                            rec = comm_log[sid][-1]
                            rec[3], rec[4] = t, x
                        if uidx[sid] >= 0:
                            cover(uidx[sid], t, x)
                        i += 1
                        push(x, sid)
                        break
                    q = other[ch]
                    if not q:
                        mine[ch].append(sid)
                        since[sid] = t
                        break
                    w = q.popleft()
                    wop = ops[w][pc[w]]
                    if op[4] != wop[4] and op[4] >= 0 and wop[4] >= 0:
                        crossed.append((sid, i, w, pc[w]) if c == SEND else (w, pc[w], sid, i))
                    d = max(op[2], wop[2])
                    x = t + d
                    wait[w] += t - since[w]
                    if spans is not None:
                        spans.append((w, since[w], t, pc[w], "wait"))
                        spans.append((w, t, x, pc[w], "busy"))
                        spans.append((sid, t, x, i, "busy"))
                    if comm_log is not None:
                        for m in (w, sid):
                            rec = comm_log[m][-1]
                            rec[3], rec[4] = t, x
                    busy[w] += d
                    busy[sid] += d
                    if uidx[w] >= 0:
                        cover(uidx[w], t, x)
                    if uidx[sid] >= 0:
                        cover(uidx[sid], t, x)
                    pc[w] += 1
                    i += 1
                    b = _get(x)
                    if b is None:
                        buckets[x] = [w, sid]
                        _heappush(times, x)
                    else:
                        b.append(w)
                        b.append(sid)
                    break
            pc[sid] = i
        del buckets[t]

    for sid in range(S):
        if pc[sid] < len(ops[sid]):
            wait[sid] += now - since[sid]
            if spans is not None:
                spans.append((sid, since[sid], now, pc[sid], "blocked"))
    busy_union = {r: cov[u] + min(cov_e[u], now) - cov_s[u] for u, r in enumerate(union_ranks)}
    return RunState(compiled, now, pc, busy, wait, since, inst_of, inst, coll_count, peak, busy_union, spans,
                    comm_log, sum(pc), mismatches, crossed)


