"""Who waits for whom across ranks and process groups, inferred from calls alone, as edges of the one wait-for
graph (findings/waitfor.py: one node per rank, edges typed `collective` or `p2p`), and its cycles (order
deadlocks) through the shared cycle finder; traces that carry each stream's state get the graph of streams too
(streams.py).

Each rank's blocking points are its oldest incomplete entry on every stream the device executes in order (one
per thread for a blocking backend's training script, one per stream for a simulated plan, one per process group
under NCCL, whose calls return before the GPU runs them: trace/frontier.py gpu_stream). An entry counts as
incomplete when its source did not mark it completed, the rank did not complete a later collective on the same group (communicators finish in order), and
the call is not known to be over from its peers' side: a collective every other member completed (a rank's own
mark can lag: Gloo retires an entry from a background thread after the call returned), a send whose matching
recv completed, a recv whose matching send completed (the data is on its way; nobody waits for anyone).
For a collective on group G at seq n, the rank waits for every member of G that has not *reached* G#n: a member
reached it if it issued G#n and has no older incomplete entry on the stream G#n was issued on. For a recv from
(send to) peer p, the rank waits for p unless p has posted the matching send (recv) - pairs match FIFO per
(sender, receiver, group). Members without a trace are nodes with no outgoing edges (they cannot be examined).

A strongly connected component with a cycle is a deadlock: no rank on it can move until another on it does.
Only collective waits on the cycle: order_deadlock; only p2p waits: p2p_deadlock; mixed: order_deadlock.

Rank-conditional calls (`conditional_waits`): a rank that waits in its first collective on a group none of the
awaited members ever issued anything on, on a cycle whose other waits are in groups every rank had used, made
a call only some ranks make (logging on rank 0 through a metrics group made with `new_group`): it is the rank
missing from where the others wait, not a party to an order swap. (A p2p wait on the cycle is no such evidence:
a stage that received fewer micro-batches than its peer sent went on to its next collective, which the peer
would make after its sends - p2p.py's count disagreement.) Its wait is taken off the graph before
cycles are sought (the rank stays blocked; analyze.py names it missing where the others wait for it). When
every wait on the cycle is such a first use (two ranks each using a fresh group first), the dumps cannot tell a
conditional call from a swap, and the cycle stays an order deadlock.
Assumption: a rank that issued an operation and has nothing older pending is able to complete it once its peers
arrive (true for NCCL and Gloo; a rank blocked in Python outside any collective has no blocking entry).
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.diagnose.match import GroupView
from distdoctor.diagnose.progress import in_no_collective, probably_inside, watched_past
from distdoctor.findings.waitfor import Cycle, Edge, Node, strong_cycles
from distdoctor.trace.frontier import gpu_stream
from distdoctor.trace.model import Entry, RankTrace, TraceSet
from distdoctor.trace.summary import summarize


@dataclass
class Wait:
    rank: int
    entry: Entry
    waits_for: list[int]
    # p2p: (this call's position among the rank's calls of its kind to/from the peer, how many matching calls
    # the peer posted); None for collectives
    p2p: tuple[int, int] | None = None


def pending_entries(ts: TraceSet, views: dict[str, GroupView],
                    p2p: dict | None = None) -> dict[int, list[Entry]]:
    """rank -> oldest incomplete entry per stream (in issue order)."""
    p2p = p2p_index(ts) if p2p is None else p2p
    out: dict[int, list[Entry]] = {}
    for rank, trace in ts.ranks.items():
        seen_streams: set = set()
        pend: list[Entry] = []
        # Only entries not marked completed are read one by one (a big trace holds few of them).
        for e in map(trace.entries.__getitem__, summarize(trace).not_done):
            stream = gpu_stream(trace, e)
            if stream in seen_streams:
                continue
            if _incomplete(rank, e, views, ts) and not (e.is_p2p and _partner_done(
                    rank, e, p2p, numbered_pairs(ts, rank, e.peer))):
                seen_streams.add(stream)
                pend.append(e)
        out[rank] = pend
    return out


def _incomplete(rank: int, e: Entry, views: dict[str, GroupView], ts: TraceSet) -> bool:
    if e.state == "completed":
        return False
    if e.seq is not None and not e.is_p2p:
        view = views.get(e.group)
        if view is not None and (view.last_completed.get(rank, -1) > e.seq or completed_by_peers(rank, e, view, ts)
                                 or view.took_part_after(rank, e.seq)):
            return False
    return True


def completed_by_peers(rank: int, e: Entry, view: GroupView, ts: TraceSet) -> bool:
    """Every other member (all of them with a trace) completed collective `e`: its communication is over, whatever
    the rank's own dump says (Gloo retires an entry a moment after the call returned)."""
    if e.seq is None:
        return False  # a call whose place in the group's order is unknown (loaders/align_ranks.py)
    least = view.least_completed_by_others(rank)
    return least is not None and least >= e.seq


def _partner_done(rank: int, e: Entry, p2p: dict, by_number: bool = False) -> bool:
    """The peer completed the other half of this send or recv (pairs match FIFO per group, sender, receiver), or,
    numbered, one after it."""
    if e.peer is None:
        return False
    mine, theirs = _halves(rank, e)
    ours = p2p.get(mine, [])
    ordinal = next((i for i, x in enumerate(ours) if x is e), None)
    match = _partner(e, ordinal, p2p.get(theirs, []), by_number)
    if match is None and by_number and e.p2p_seq is not None:  # a tail that no longer holds it: a later message
        # of the pair completed on the peer's side, and a pair's messages complete in order (Gloo, NCCL)
        return any(x.state == "completed" and (x.p2p_seq or 0) > e.p2p_seq for x in p2p.get(theirs, []))
    return ordinal is not None and match is not None and match.state == "completed"


def _partner(e: Entry, ordinal: int | None, theirs: list[Entry], by_number: bool) -> Entry | None:
    """The other half of a send or recv: with `by_number` (both sides' traces are the recorder's, which numbers
    p2p calls per peer and direction from 1: `p2p_seq`) the one of the same number - a trace that keeps only its
    last calls, a live state's or a wrapped ring's, still pairs right -, else the one at the same place in the
    peer's list (FIFO; Flight Recorder numbers every p2p call of a group, so its numbers do not pair)."""
    if by_number and e.p2p_seq is not None and all(x.p2p_seq is not None for x in theirs):
        return next((x for x in theirs if x.p2p_seq == e.p2p_seq), None)
    return theirs[ordinal] if ordinal is not None and ordinal < len(theirs) else None


def numbered_pairs(ts: TraceSet, rank: int, peer: int | None) -> bool:
    """Whether both ranks' p2p numbers are the recorder's own (traces of the recorder alone)."""
    return peer is not None and all(ts.ranks.get(r) is not None and ts.ranks[r].source == "native"
                                    for r in (rank, peer))


def _halves(rank: int, e: Entry) -> tuple[tuple, tuple]:
    """The index keys of this entry's list and of its partner's list."""
    if e.op == "send":
        return (e.group, rank, e.peer, "send"), (e.group, rank, e.peer, "recv")
    return (e.group, e.peer, rank, "recv"), (e.group, e.peer, rank, "send")


def p2p_entries(trace: RankTrace) -> list[Entry]:
    """The rank's sends and receives, in issue order (found from the op column: most traces hold none)."""
    return [trace.entries[i] for i in summarize(trace).p2p]


def whole_p2p(entries: list[Entry]) -> bool:
    """Whether these sends and receives hold every call from the first, numbered 1, 2, ... per peer and direction
    (the recorder) or per group (Flight Recorder's p2p_seq_id), not the tail a live state or a wrapped ring
    keeps: a rank's own history, and its calls read against other ranks', mean something only then. Calls with
    no numbers at all cannot tell, and are taken whole."""
    if all(e.p2p_seq is None for e in entries):
        return True
    streams: dict[tuple, list] = {}
    groups: dict[str, list] = {}
    for e in entries:
        streams.setdefault((e.group, e.op, e.peer), []).append(e.p2p_seq)
        groups.setdefault(e.group, []).append(e.p2p_seq)
    return _from_one(streams) or _from_one(groups)


def _from_one(numbers: dict) -> bool:
    return all(s == list(range(1, len(s) + 1)) for s in numbers.values())


def p2p_index(ts: TraceSet) -> dict[tuple[str, int, int, str], list[Entry]]:
    """(group, sender, receiver, 'send'|'recv') -> entries in issue order, as seen by the posting rank."""
    idx: dict[tuple[str, int, int, str], list[Entry]] = {}
    for rank, trace in ts.ranks.items():
        for e in p2p_entries(trace):
            if e.op == "send" and e.peer is not None:
                idx.setdefault((e.group, rank, e.peer, "send"), []).append(e)
            elif e.op == "recv" and e.peer is not None:
                idx.setdefault((e.group, e.peer, rank, "recv"), []).append(e)
    return idx


def build_waits(ts: TraceSet, views: dict[str, GroupView],
                p2p: dict | None = None) -> tuple[list[Wait], dict[int, list[Entry]]]:
    """The waits and each rank's pending entries; `p2p`: p2p_index(ts) when the caller has it."""
    p2p = p2p_index(ts) if p2p is None else p2p
    pending = pending_entries(ts, views, p2p)
    first_pending = {r: {gpu_stream(ts.ranks[r], e): e.index for e in es} for r, es in pending.items()}
    waits: list[Wait] = []
    behind: dict[tuple, list[int]] = {}  # (group, seq, raw_op) -> the members that have not reached that call
    for rank, entries in pending.items():
        for e in entries:
            if e.is_p2p:
                if e.peer is None:
                    continue
                key, other = _halves(rank, e)
                mine = p2p.get(key, [])
                ordinal = next((i for i, x in enumerate(mine) if x is e), 0)
                theirs = p2p.get(other, []) if e.peer in ts.ranks else []
                by_number = numbered_pairs(ts, rank, e.peer)
                match = _partner(e, ordinal, theirs, by_number)
                if match is None or not _reached(e.peer, match, first_pending, ts):
                    posted = max((x.p2p_seq or 0 for x in theirs), default=0) if by_number else len(theirs)
                    waits.append(Wait(rank, e, [e.peer], ((e.p2p_seq or 1) - 1 if by_number else ordinal, posted)))
                continue
            view = views.get(e.group)
            if view is None:
                continue
            if e.seq is None:  # its place in the group's order is unknown (loaders/align_ranks.py): it waits at
                # least for the members in no collective at all, as their dumps show
                idle = [m for m in view.members if m != rank and (m not in ts.ranks or in_no_collective(ts.ranks[m]))]
                if idle:
                    waits.append(Wait(rank, e, idle))
                continue
            # Every member pending in one collective has the same members behind it (but itself): found once
            # per call, not once per member (a world-sized group would make that world x world).
            key = (e.group, e.seq, e.raw_op)
            late = behind.get(key)
            if late is None:
                late = behind[key] = _behind(e, view, ts, first_pending)
            blockers = [m for m in late if m != rank]
            if blockers:
                waits.append(Wait(rank, e, blockers))
    return waits, pending


def _behind(e: Entry, view: GroupView, ts: TraceSet, first_pending: dict[int, dict]) -> list[int]:
    """The members of `e`'s group that have not reached collective `e`, in member order."""
    late = []
    for m in view.members:
        if m not in ts.ranks:
            late.append(m)
            continue
        if view.last_completed.get(m, -1) >= e.seq:
            continue  # it completed the collective (an active-only dump no longer lists it)
        theirs = view.by_rank.get(m, {}).get(e.seq)
        watched = view.watched_in.get(m)
        if theirs is None and (watched_past(*watched, e.seq, e.op) if watched else probably_inside(ts.ranks[m], e)):
            continue  # its trace cannot show this call (issued from C++), and its own watchdog saw it blocked in
            # this call or a later one of the group (hang_status.py), or, unwatched, it is inside torch
        if theirs is None or not _reached(m, theirs, first_pending, ts):
            late.append(m)
    return late


def _reached(rank: int, entry: Entry, first_pending: dict[int, dict], ts: TraceSet) -> bool:
    """The rank issued `entry` and nothing older is still pending on that stream."""
    oldest = first_pending.get(rank, {}).get(gpu_stream(ts.ranks[rank], entry))
    return oldest is None or oldest >= entry.index


def on_possible_cycle(waits: list[Wait]) -> list[Wait]:
    """The waits that could lie on a cycle: repeatedly drop waits for ranks that wait for nobody still left
    (a rank missing a trace, or one free to move, ends every chain that reaches it). Usually nothing is left."""
    left = list(waits)
    while True:
        waiting = {w.rank for w in left}
        kept = [w for w in left if any(r in waiting for r in w.waits_for)]
        if len(kept) == len(left):
            return kept
        left = kept


def first_use(w: Wait, views: dict[str, GroupView], ts: TraceSet) -> bool:
    """A collective wait in the rank's first call on its group (it completed none there, and the call is not the
    group's #n > 1: those before it were made) for members that hold no entry at all on that group, though they
    left a trace."""
    e = w.entry
    view = views.get(e.group)
    if e.is_p2p or view is None or view.last_completed.get(w.rank, -1) >= 0 or (e.seq or 0) > 1:
        return False
    return all(q in ts.ranks and not view.by_rank.get(q) for q in w.waits_for)


def conditional_waits(waits: list[Wait], cycles: list[Cycle], views: dict[str, GroupView],
                      ts: TraceSet) -> list[Wait]:
    """The waits of rank-conditional calls (see the module's docstring): first-use waits on a cycle that also
    holds a collective wait in a group its rank had used."""
    out: list[Wait] = []
    for c in cycles:
        ranks = set(c.ranks)
        inside = [w for w in waits if w.rank in ranks and ranks.intersection(w.waits_for)]
        fresh = [w for w in inside if first_use(w, views, ts)]
        if fresh and any(not w.entry.is_p2p and not any(w is f for f in fresh) for w in inside):
            out.extend(fresh)
    return out


def wait_edges(waits: list[Wait]) -> dict[Node, list[Edge]]:
    """The waits as edges of the one wait-for graph (findings/waitfor.py): a rank is one node (rank, None), as
    calls alone say nothing of its streams' events and buffers."""
    edges: dict[Node, list[Edge]] = {}
    for w in waits:
        e = w.entry
        kind = "p2p" if e.is_p2p else "collective"
        resource = f"p2p {e.op} {e.peer}" if e.is_p2p else f"collective {e.group} #{e.seq}"
        out = edges.setdefault((w.rank, None), [])
        for other in w.waits_for:
            out.append(Edge((w.rank, None), (other, None), kind, resource, other, group=e.group, op=e.op,
                            seq=e.p2p_seq if e.is_p2p else e.seq, peer=e.peer, why=w))
    return edges


def find_cycles(waits: list[Wait]) -> list[Cycle]:
    """One cycle per strongly connected component of the waits (the shared cycle finder)."""
    return strong_cycles(wait_edges(waits)) if waits else []
