"""Discrete-event execution of a Program: timing, blocking, and what is left when nothing can move.

Algorithm. Every stream is a cursor over its ops. A heap holds (time, order, stream) "this stream may try
its next op now". A popped stream runs zero-time ops (record, wait on a recorded event, acquire of a free
slot, release) inline and stops at the first op that takes time or blocks:
- compute: busy for `us`, then back on the heap at t + us;
- wait: parks on the event until a `record` on the same rank (once recorded, an event stays recorded);
- acquire: parks FIFO on the buffer; `release` hands the slot to the first parked acquirer;
- collective: the n-th collective a rank issues on a group joins instance (group, n); the instance starts
  when every member has arrived, and holds every member's stream until start + duration;
- send/recv: FIFO per (sender, receiver, tag) channel; a pair starts when both are posted and holds both.
Popping in time order makes "the n-th collective issued" and buffer hand-over follow simulated time; ties
keep heap insertion order, so runs are deterministic. When the heap is empty and some stream has ops left,
that is a deadlock; `waitfor.analyze` then builds the wait-for graph and extracts the cycle.

Durations: `us` when an op gives it, else the cost model: collectives alpha + bytes * bus_factor(kind, n) /
bandwidth with nccl-tests' bus factors (distdoctor.collectives, the one source of truth); p2p alpha +
bytes / bandwidth. The hot loop sees only ints, floats and tuples (no pydantic, no names).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from heapq import heappop, heappush

from distdoctor.collectives import bus_factor
from distdoctor.sim.ir import Op, Program

COMPUTE, RECORD, WAIT, ACQUIRE, RELEASE, COLLECTIVE, SEND, RECV = range(8)
_CODES = {"compute": COMPUTE, "record": RECORD, "wait": WAIT, "acquire": ACQUIRE, "release": RELEASE,
          "collective": COLLECTIVE, "send": SEND, "recv": RECV}
_INST = 1 << 32  # instance key = group id * _INST + per-group collective number


def collective_us(op: Op, n: int, alpha_us: float, gbps: float) -> float:
    if op.us is not None:
        return float(op.us)
    if op.kind == "barrier" or n <= 1:
        return alpha_us if n > 1 else 0.0
    return alpha_us + op.bytes * bus_factor(op.kind, n) / (gbps * 1e3)  # GB/s = 1e3 bytes/us


def p2p_us(op: Op, alpha_us: float, gbps: float) -> float:
    return float(op.us) if op.us is not None else alpha_us + op.bytes / (gbps * 1e3)


@dataclass
class Compiled:
    """The program as integer-indexed arrays."""

    program: Program
    streams: list[tuple[int, str]]  # sid -> (rank, stream name)
    ops: list[list[tuple]]  # sid -> compiled ops
    rank_of: list[int]
    group_names: list[str]
    group_members: list[list[int]]
    buffer_keys: list[tuple[int, str]]  # bid -> (rank, name)
    capacity: list[int]
    event_keys: list[tuple[int, str]]
    channels: list[tuple[int, int, str]]  # chan -> (src, dst, tag)
    compute_sids: set[int]


def compile_program(prog: Program) -> Compiled:
    group_names = list(prog.groups)
    gid = {g: i for i, g in enumerate(group_names)}
    members = [list(prog.groups[g]) for g in group_names]
    gsize = [len(m) for m in members]
    alpha, gbps = prog.cost.alpha_us, prog.cost.gbps
    streams, ops_out, rank_of, buffer_keys, capacity = [], [], [], [], []
    event_id: dict[tuple[int, str], int] = {}
    chan_id: dict[tuple[int, int, str], int] = {}
    compute_sids = set()
    coll_cache: dict[tuple, float] = {}
    for r in sorted(prog.ranks):
        rp = prog.ranks[r]
        bid = {}
        for b, cap in rp.buffers.items():
            bid[b] = len(buffer_keys)
            buffer_keys.append((r, b))
            capacity.append(cap)
        for s, ops in rp.streams.items():
            sid = len(streams)
            streams.append((r, s))
            rank_of.append(r)
            out = []
            for op in ops:
                k = op.op
                if k == "compute":
                    out.append((COMPUTE, float(op.us)))
                    compute_sids.add(sid)
                elif k == "record" or k == "wait":
                    e = event_id.setdefault((r, op.event), len(event_id))
                    out.append((RECORD if k == "record" else WAIT, e))
                elif k == "acquire" or k == "release":
                    out.append((ACQUIRE if k == "acquire" else RELEASE, bid[op.buffer]))
                elif k == "collective":
                    g = gid[op.group]
                    ck = (op.us, op.kind, op.bytes, gsize[g])
                    d = coll_cache.get(ck)
                    if d is None:
                        d = coll_cache[ck] = collective_us(op, gsize[g], alpha, gbps)
                    out.append((COLLECTIVE, g, d))
                else:
                    key = (r, op.peer, op.tag) if k == "send" else (op.peer, r, op.tag)
                    ch = chan_id.setdefault(key, len(chan_id))
                    out.append((SEND if k == "send" else RECV, ch, p2p_us(op, alpha, gbps)))
            ops_out.append(out)
    return Compiled(prog, streams, ops_out, rank_of, group_names, members, buffer_keys, capacity,
                    list(event_id), list(chan_id), compute_sids)


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
    open_instances: dict[int, list]  # instance key -> [remaining, sids, duration]
    coll_count: dict[int, int]  # rank * n_groups + gid -> collectives issued
    peak: list[int]
    busy_union: dict[int, float]  # rank -> time any compute stream was busy (ranks with >1 compute stream)
    spans: list[tuple] | None  # (sid, start, end, op_index, "busy"|"wait"|"blocked")
    comm_log: list[list[list]] | None  # sid -> [[op_index, seq, t_issue, t_start, t_end], ...]
    ops_executed: int

    @property
    def deadlock(self) -> bool:
        return any(p < len(o) for p, o in zip(self.pc, self.compiled.ops))

    def blocked_sids(self) -> list[int]:
        return [s for s, (p, o) in enumerate(zip(self.pc, self.compiled.ops)) if p < len(o)]


def run(compiled: Compiled, detail: bool = False) -> RunState:
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
    coll_count: dict[int, int] = {}
    inst: dict[int, list] = {}
    inst_of: dict[int, int] = {}
    spans: list[tuple] | None = [] if detail else None
    comm_log = [[] for _ in range(S)] if detail else None
    # Ranks with several compute streams need the union of their busy time for the bubble fraction.
    by_rank: dict[int, list[int]] = {}
    for s in compiled.compute_sids:
        by_rank.setdefault(rank_of[s], []).append(s)
    union_sids = {s for ss in by_rank.values() if len(ss) > 1 for s in ss}
    intervals: dict[int, list] = {rank_of[s]: [] for s in union_sids}

    heap = [(0.0, sid, sid) for sid in range(S)]
    order = S
    now = 0.0
    while heap:
        t, _, sid = heappop(heap)
        now = t
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
                if sid in union_sids:
                    intervals[rank_of[sid]].append((t, t + d))
                i += 1
                if d > 0:
                    order += 1
                    heappush(heap, (t + d, order, sid))
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
                            order += 1
                            heappush(heap, (t, order, w))
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
                    order += 1
                    heappush(heap, (t, order, w))
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
                    st = inst[ik] = [gsize[g], [], 0.0]
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
                for m in st[1]:
                    if m != sid:
                        wait[m] += t - since[m]
                        if spans is not None:
                            spans.append((m, since[m], t, pc[m], "wait"))
                        pc[m] += 1
                        del inst_of[m]
                    busy[m] += d
                    if spans is not None:
                        spans.append((m, t, t + d, pc[m] - 1 if m != sid else i, "busy"))
                    if comm_log is not None:
                        rec = comm_log[m][-1]
                        rec[3], rec[4] = t, t + d
                    if m in union_sids:
                        intervals[rank_of[m]].append((t, t + d))
                    if m != sid:
                        order += 1
                        heappush(heap, (t + d, order, m))
                i += 1
                order += 1
                heappush(heap, (t + d, order, sid))
                break
            else:  # SEND / RECV
                ch = op[1]
                mine, other = (sendq, recvq) if c == SEND else (recvq, sendq)
                side = 0 if c == SEND else 1
                chan_n[ch][side] += 1
                if comm_log is not None:
                    comm_log[sid].append([i, chan_n[ch][side], t, None, None])
                q = other[ch]
                if not q:
                    mine[ch].append(sid)
                    since[sid] = t
                    break
                w = q.popleft()
                d = max(op[2], ops[w][pc[w]][2])
                wait[w] += t - since[w]
                if spans is not None:
                    spans.append((w, since[w], t, pc[w], "wait"))
                    spans.append((w, t, t + d, pc[w], "busy"))
                    spans.append((sid, t, t + d, i, "busy"))
                if comm_log is not None:
                    for m in (w, sid):
                        rec = comm_log[m][-1]
                        rec[3], rec[4] = t, t + d
                for m in (w, sid):
                    busy[m] += d
                    if m in union_sids:
                        intervals[rank_of[m]].append((t, t + d))
                pc[w] += 1
                order += 1
                heappush(heap, (t + d, order, w))
                i += 1
                order += 1
                heappush(heap, (t + d, order, sid))
                break
        pc[sid] = i

    for sid in range(S):
        if pc[sid] < len(ops[sid]):
            wait[sid] += now - since[sid]
            if spans is not None:
                spans.append((sid, since[sid], now, pc[sid], "blocked"))
    busy_union = {r: _union_length(iv, now) for r, iv in intervals.items()}
    return RunState(compiled, now, pc, busy, wait, since, inst_of, inst, coll_count, peak, busy_union, spans,
                    comm_log, sum(pc))


def _union_length(intervals: list[tuple[float, float]], end: float) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        e = min(e, end)
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total
