"""Messages a stage owes: the one rank of a p2p cycle that sends what nothing fed, holds what it should have passed
on, or waits for what nobody owes it.

A pipeline stage's sends are fed by its receives. A middle stage with two peers passes on what it gets: its
sends to one peer are fed by its receives from the other (activations forward, gradients back). An end stage
with one peer answers it: its sends to that peer are fed by its receives from it (the last stage's gradient for
each activation). Counted from the calls a rank *issued* (so it holds under NCCL, whose calls return before the
GPU runs them, as under Gloo), a flow is fed where, at each of its sends, the rank had issued at least as many
receives from the feeding peer. The first stage's sends come from its data, before any receive: its flow is not
fed, and nothing is read from it.

Three departures follow, each the rank's own, whatever the schedule (GPipe, 1F1B, micro-batches that change from
step to step), and each shows where a rank's own history is too short to show a round (p2p.py,
`breaks_pattern`) and no other rank shares its role (p2p_roles.py): the end stages (fuzz runs 72-119, 73-70,
75-70, 75-102, 75-122: the last stage's recv issued twice or skipped, named with its peer as one cycle).
- **A send nothing fed** (`unfed`): a flow fed at every earlier send issues one more send than it had
  receives for, and that send is still waiting (the last stage skipped a receive and sent the gradients back:
  its last gradient answers an activation it never received).
- **A wait nobody owes** (`unowed`): the rank waits in its k-th receive from a peer whose flow to it is fed, has
  passed on every receive that fed it (fewer than k), and has nothing more on its way to pass on (it waits in
  no receive from its feeder, and its feeder issued it no send it has not received): the peer owes it nothing
  (the last stage issued a receive twice and waits for an activation the stage before never had; a middle stage
  that asked the wrong peer while its feeder waits to hand it the next activation, fuzz runs 74-2, 74-111).
- **A message held** (`held`): a middle stage received more from its feeder than it sent on, each send fed,
  and waits in another call than one on that flow (it skipped a send and went on: fuzz run 75-150); a stage
  that receives a phase's messages before it sends them on holds some by design while it receives or sends.
On a cycle of p2p waits, the one rank with such a departure is named, where no other rank on the cycle has one
and none opens a flow at the hang (`opens_flow`: two neighbours that both send first). A rank waiting on an idle
peer is named for its own sends and holds; for a wait nobody owes only where the peer ran its program to its end
(p2p.py, `_owes_more`). A history that does not start at the first call of each stream (a ring buffer that
wrapped, a live state's tail), or a rank with more than two peers in the group, is not read.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.diagnose.waitfor import p2p_entries, whole_p2p
from distdoctor.findings.kinds import fmt_ranks, nth
from distdoctor.trace.model import TraceSet

MIN_FED = 2  # sends a flow must have had fed before it is read as fed (one proves nothing)


@dataclass(frozen=True)
class Departure:
    rank: int
    kind: str  # "unfed" (a send nothing fed), "held" (a message not passed on) or "unowed" (a wait nobody owes)
    peer: int
    text: str


@dataclass(frozen=True)
class _Calls:
    """A rank's sends and receives in one group, in issue order: (op, peer, completed)."""
    calls: list[tuple[str, int, bool]]

    def peers(self) -> set[int]:
        return {p for _, p, _ in self.calls}

    def feeder(self, to: int) -> int | None:
        """The peer whose receives feed the sends to `to`: the other peer of a stage with two, `to` itself for a
        stage with one; None for more."""
        peers = self.peers()
        if len(peers) == 1:
            return to
        if len(peers) == 2:
            return next(p for p in peers if p != to)
        return None

    def count(self, op: str, peer: int) -> int:
        return sum(1 for o, p, _ in self.calls if (o, p) == (op, peer))


def p2p_calls(ts: TraceSet, rank: int, group: str) -> _Calls | None:
    """The rank's calls in `group`, where its history holds every call of each stream from the first."""
    if rank not in ts.ranks:
        return None
    entries = [e for e in p2p_entries(ts.ranks[rank]) if e.group == group and e.peer is not None]
    if not whole_p2p(entries):
        return None
    return _Calls([(e.op, e.peer, e.state == "completed") for e in entries])


def _fed_sends(c: _Calls, to: int) -> tuple[int, int | None]:
    """(how many sends to `to` were fed in a row from the first, the index of the first that was not)."""
    src = c.feeder(to)
    sends = recvs = 0
    for i, (op, peer, _) in enumerate(c.calls):
        if op == "recv" and peer == src:
            recvs += 1
        if op == "send" and peer == to:
            sends += 1
            if sends > recvs:
                return sends - 1, i
    return sends, None


def unfed(c: _Calls, rank: int, min_fed: int = MIN_FED) -> Departure | None:
    """A send nothing fed, on a flow fed at every earlier send (`min_fed` of them at least), still waiting, or
    followed by sends still more than the receives that feed them, the last one waiting."""
    for to in sorted(c.peers()):
        fed, broke = _fed_sends(c, to)
        if broke is None or fed < min_fed:
            continue
        src = c.feeder(to)
        last = max(i for i, (op, p, _) in enumerate(c.calls) if (op, p) == ("send", to))
        over = c.count("send", to) > c.count("recv", src)
        if c.calls[broke][2] and not (over and not c.calls[last][2]):
            continue
        return Departure(rank, "unfed", to, (
            f"rank {rank} issued its {nth(fed + 1)} send to rank {to} having issued only {fed} receive"
            f"{'s' if fed != 1 else ''} from rank {src}, which fed each of its sends to rank {to} before: a send "
            f"nothing fed (a receive skipped, or a send issued twice)"))
    return None


def unowed(ts: TraceSet, group: str, rank: int, peer: int, k: int, min_fed: int = MIN_FED) -> Departure | None:
    """Rank waits in its k-th receive from `peer`, and the peer owes it nothing (see the module's docstring): its
    flow to the rank is settled, or, a peer it never exchanged a message with, every flow of the peer is.
    `min_fed`: 1 for a peer whose program ended (its history is whole: one send it answered is all it had)."""
    theirs = p2p_calls(ts, peer, group)
    if theirs is None or not theirs.peers():
        return None
    stranger = rank not in theirs.peers()
    flows = sorted(theirs.peers()) if stranger else [rank]
    settled = [_settled(ts, group, peer, theirs, to, min_fed) for to in flows]
    if any(x is None for x in settled) or (not stranger and settled[0][1] >= k):
        return None
    if stranger:
        return Departure(rank, "unowed", peer, (
            f"rank {rank} waits in its {nth(k)} receive from rank {peer}, which never exchanged a message with it "
            f"and passed on all it had to {fmt_ranks(flows)}, each of its sends fed by a receive before, and waits "
            f"for nothing more: rank {peer} owes it nothing (a receive from the wrong peer)"))
    if any(to != rank for to, *_ in holds(ts, group, peer, theirs)):
        return None  # it holds what the rank sent it: the answer is on the other side of it
    (had, sent), src = settled[0], theirs.feeder(rank)
    fed_by = f"its receives from rank {src}" if src != rank else f"rank {rank}'s sends"
    return Departure(rank, "unowed", peer, (
        f"rank {rank} waits in its {nth(k)} receive from rank {peer}, but rank {peer} passed on all {had} "
        f"message{'s' if had != 1 else ''} it had from {'rank ' + str(src) if src != rank else 'it'} ({sent} sends "
        f"to rank {rank}, each fed by {fed_by}) and waits for nothing more to pass on: rank {peer} owes it nothing "
        f"(a receive issued twice, or a send to it skipped)"))


def _settled(ts: TraceSet, group: str, rank: int, c: _Calls, to: int, min_fed: int) -> tuple[int, int] | None:
    """(had, sent) where the rank's flow to `to` is fed at every send and passed on in full, with nothing more on
    its way to it: what it had is what its feeder sent it as far as it posted receives for it (a receive posted
    twice brings nothing); more is on its way where the feeder sent more than it took, or it waits in a receive
    from the feeder (unless the feeder is `to` itself, which then waits on it in turn). None otherwise."""
    src = c.feeder(to)
    feeder = None if src is None else p2p_calls(ts, src, group)
    fed, broke = _fed_sends(c, to)
    if feeder is None or broke is not None or fed < min_fed:
        return None
    offered, taken = feeder.count("send", rank), c.count("recv", src)
    had, sent = min(offered, taken), c.count("send", to)
    if had > sent or offered > taken or (src != to and _waits_for(c, src)):
        return None
    return had, sent


def held(ts: TraceSet, group: str, rank: int, c: _Calls) -> Departure | None:
    """A middle stage that holds a message it never passed on (`_holds`) and waits in no call on that flow (a
    stage that receives a step's messages first and then sends them on holds the first while it receives the
    rest, and the rest while it sends one)."""
    for to, src, had, sent in holds(ts, group, rank, c):
        if not any((op, p) in (("send", to), ("recv", src)) and not done for op, p, done in c.calls):
            return Departure(rank, "held", to, (
                f"rank {rank} received {had} messages from rank {src} and passed on only {sent} to rank {to}, "
                f"each of its sends to rank {to} fed by a receive from rank {src} before: it holds one it never "
                f"sent on (a send skipped, or a receive issued twice) and waits in another call"))
    return None


def holds(ts: TraceSet, group: str, rank: int, c: _Calls) -> list[tuple[int, int, int, int]]:
    """(to, from, had, sent) of each flow of a middle stage whose feeder sent it more than it sent on (it posted
    the receives), fed at every send so far."""
    out = []
    for to in sorted(c.peers()) if len(c.peers()) == 2 else []:
        src = c.feeder(to)
        fed, broke = _fed_sends(c, to)
        feeder = p2p_calls(ts, src, group)
        if broke is not None or fed < MIN_FED or feeder is None:
            continue
        had, sent = min(feeder.count("send", rank), c.count("recv", src)), c.count("send", to)
        if had > sent:
            out.append((to, src, had, sent))
    return out


def _waits_for(c: _Calls, src: int) -> bool:
    """Whether the rank waits in a receive from `src` (more may come to it to pass on)."""
    return any(op == "recv" and p == src and not done for op, p, done in c.calls)


def owed_departures(ts: TraceSet, steps: list[tuple[int, int, object]], peers_wait: bool = True,
                    peers_ended: bool = False) -> list[Departure]:
    """Each rank of a cycle's steps (rank, peer it waits for, its Wait) with a send nothing fed, a message held,
    or (`peers_wait`: the peer waits in a call, as on a cycle, or `peers_ended` its program) a wait nobody owes. A
    peer in no call may be stopped anywhere before the receive that would feed it: what it owes next is not
    known."""
    out = []
    for a, b, w in steps:
        e = w.entry
        mine = p2p_calls(ts, a, e.group)
        if mine is None:
            continue
        found = None  # its own flows read only where each peer's feeder is known (one or two peers)
        if mine.feeder(b) is not None:
            found = unfed(mine, a, 1 if peers_ended else MIN_FED) or held(ts, e.group, a, mine)
        if found is None and (peers_wait or peers_ended) and e.op == "recv" and e.peer == b:
            found = unowed(ts, e.group, a, b, e.p2p_seq, 1 if peers_ended else MIN_FED)
        if found is not None:
            out.append(found)
    return out


def opens_flow(ts: TraceSet, group: str, rank: int) -> bool:
    """Whether the rank's calls open a flow mid-way: its first send to a peer, after calls of its own, still
    waiting, or one no receive fed (a stage that sends upstream where it only ever received: an order swapped
    with its neighbour's). Nothing says whether that send deviates or the program turned a corner; a rank
    beside it on a cycle is not named alone for its own departure (both may have deviated)."""
    c = p2p_calls(ts, rank, group)
    if c is None or len(c.peers()) not in (1, 2):  # whose feeders are known
        return False
    firsts = [next(i for i, (op, p, _) in enumerate(c.calls) if (op, p) == ("send", to))
              for to in c.peers() if c.count("send", to)]
    return any(i > 0 and not c.calls[i][2] for i in firsts) or any(  # a flow that begins at the hang
        fed == 0 and broke is not None and broke > 0 and not c.calls[broke][2]
        for fed, broke in (_fed_sends(c, to) for to in c.peers()))


def owed(ts: TraceSet, group: str, rank: int, peer: int, k: int) -> bool:
    """Whether `peer` owes `rank` its k-th message: its flow to the rank is fed, and its feeder sent it at least k
    messages, taken or still to take (the answer to a call that is no departure, whatever the rank's rounds)."""
    theirs = p2p_calls(ts, peer, group)
    src = None if theirs is None or rank not in theirs.peers() else theirs.feeder(rank)
    feeder = None if src is None else p2p_calls(ts, src, group)
    if feeder is None or _fed_sends(theirs, rank)[1] is not None:
        return False
    return feeder.count("send", peer) >= k
