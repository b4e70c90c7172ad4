"""p2p_order: a send/recv order that completes only because sends are buffered.

Replays each rank's point-to-point calls in issue order under rendezvous semantics, the way NCCL runs them once a
message is above its buffering limit (or any blocking p2p): a send or receive not in a batch finishes only when
the peer's matching call is the one the peer is at (NCCL runs one peer pair's calls in order on one stream; an
unbatched `isend` is no different); a `batch_isend_irecv` is posted whole and finishes when all its calls have
matched. Matching is by channel, the n-th send a -> b with the n-th receive b <- a on the same group. When no
rank can move, the ranks left at a call form the hazard: e.g. two ranks that both `isend` and then `recv` from
each other (Gloo runs the isend on its own thread; NCCL above its eager size deadlocks), the fixed p2p order of
Megatron-LM #5100. Needs the recorder's traces: Gloo's Flight Recorder records no send/recv, and NCCL's numbers
batched calls in a way this replay does not read (its p2p entries are left out).
"""

from __future__ import annotations

from distdoctor.findings.kinds import fmt_ranks
from distdoctor.lint.hazard import Hazard, call, site_of
from distdoctor.trace.model import Entry, TraceSet
from distdoctor.trace.summary import summarize


def _steps(entries: list[Entry]) -> list[list[Entry]]:
    """A rank's p2p calls as steps: one call, or one batch_isend_irecv (its calls share their start time)."""
    steps: list[list[Entry]] = []
    batch_key = None
    for e in entries:
        if e.peer is None:
            continue  # a receive from any source whose sender was never learned: nothing to match
        key = (e.t_started, e.group) if e.raw_op.startswith("batch_isend_irecv") else None
        if key is not None and key == batch_key:
            steps[-1].append(e)
        else:
            steps.append([e])
        batch_key = key
    return steps


def _replay(progs: dict[int, list[list[Entry]]]) -> dict[int, list[Entry]]:
    """rank -> the unmatched calls of the step it is stuck at; empty when every rank gets through."""
    pc = {r: 0 for r in progs}
    done: set[int] = set()  # id() of matched calls
    counters: dict[int, dict[tuple, int]] = {r: {} for r in progs}
    channel: dict[int, tuple] = {}  # id(call) -> (group, src, dst, n)
    for r, steps in progs.items():
        for step in steps:
            for e in step:
                k = (e.group, r, e.peer) if e.op == "send" else (e.group, e.peer, r)
                n = counters[r][(e.op, *k)] = counters[r].get((e.op, *k), 0) + 1
                channel[id(e)] = (*k, n)
    while True:
        # the calls each rank offers now, by channel and direction
        offered: dict[tuple, Entry] = {}
        for r, steps in progs.items():
            if pc[r] < len(steps):
                for e in steps[pc[r]]:
                    if id(e) not in done:
                        offered[(e.op, channel[id(e)])] = e
        moved = False
        for (op, ch), e in list(offered.items()):
            if op == "send" and ("recv", ch) in offered:
                done.add(id(e))
                done.add(id(offered[("recv", ch)]))
                moved = True
        for r, steps in progs.items():
            while pc[r] < len(steps) and all(id(e) in done for e in steps[pc[r]]):
                pc[r] += 1
                moved = True
        if not moved:
            break
    return {r: [e for e in steps[pc[r]] if id(e) not in done] for r, steps in progs.items() if pc[r] < len(steps)}


def find(ts: TraceSet) -> list[Hazard]:
    progs: dict[int, list[list[Entry]]] = {}
    for r, trace in ts.ranks.items():
        if not trace.source.startswith("native"):
            continue  # the recorder's view (or merged with it) only; see the module docstring
        positions = summarize(trace).p2p
        if positions:
            progs[r] = _steps([trace.entries[i] for i in positions])
    if not progs:
        return []
    stuck = _replay(progs)
    if not stuck:
        return []
    # the stuck ranks waiting on each other: each is at a call whose peer is stuck too
    parts = sorted(r for r, calls in stuck.items() if any(e.peer in stuck for e in calls))
    if not parts:
        return []
    h = Hazard("p2p_order", parts, sorted({e.group for r in parts for e in stuck[r]}), "")
    words = []
    for r in parts:
        e = stuck[r][0]
        prog = ts.ranks[r]
        before = [x for x in (prog.entries[i] for i in summarize(prog).p2p) if x.index < e.index and
                  x.peer is not None]
        prev = before[-1] if before else None
        verb = "send to" if e.op == "send" else "receive from"
        was = f" after {'an unbatched ' if not prev.raw_op.startswith('batch') else ''}{prev.raw_op or prev.op} " \
              f"to/from rank {prev.peer}" if prev is not None else ""
        words.append(f"rank {r} waits to {verb} rank {e.peer} ({call(e)}{was})")
        h.add_site([r], f"is at {call(e)} (peer {e.peer}), called from", site_of(e))
        if prev is not None:
            h.add_site([r], f"after {call(prev)} (peer {prev.peer}), called from", site_of(prev))
    h.detail = (f"{fmt_ranks(parts)}: this send/recv order completes only because sends are buffered or run "
                f"asynchronously ({'; '.join(words[:6])}); with blocking p2p or messages above NCCL's eager size "
                f"it deadlocks. Post both directions together (batch_isend_irecv) or order them by rank parity.")
    h.evidence = {"stuck_at": {str(r): [{"op": e.op, "peer": e.peer, "p2p_seq": e.p2p_seq, "group": e.group}
                                        for e in stuck[r]] for r in parts}}
    return [h]
