"""The ranks that left no dump: where the survivors stand without them (`missing_dump`), and the ranks alive that
never issued the call the others wait in beside them, either of which may have stopped the job (`hedge_lost`).
A skip the call sites show outranks both (parted.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distdoctor.diagnose.crash import ended_on_their_own
from distdoctor.diagnose.p2p import message_of
from distdoctor.diagnose.progress import shows_no_p2p
from distdoctor.diagnose.waitfor import p2p_entries
from distdoctor.findings.kinds import Finding, fmt_ranks
from distdoctor.trace.model import Entry, TraceSet

if TYPE_CHECKING:
    from distdoctor.diagnose.match import Divergence, GroupView
    from distdoctor.diagnose.waitfor import Wait


def missing_dump(no_dump: list[int], waits: list[Wait], views: dict[str, GroupView], ts: TraceSet) -> Finding:
    """Where the survivors stand: the collective they wait in for the lost ranks, else the last collective the
    survivors issued on the default group (the lost ranks cannot have completed it); "one of" every rank where
    the survivors' dumps show nothing at all (`_blind_survivors`)."""
    blocked = sorted({w.rank for w in waits if set(w.waits_for) & set(no_dump)})
    detail = f"{fmt_ranks(no_dump)} left no trace (crashed, killed, or never dumped)."
    group = seq = op = t = None
    view = views.get("0")
    if view is not None:
        last = [(max(seqs), r) for r, seqs in view.by_rank.items() if seqs]
        if last:
            seq, r = max(last, key=lambda x: x[0])
            e = view.by_rank[r][seq]
            group, op, t = "0", e.op, e.t_created
            detail += f" The survivors got as far as {op} #{seq} on the default group '0'."
    if blocked:
        detail += f" {fmt_ranks(blocked)} {'is' if len(blocked) == 1 else 'are'} blocked waiting for them."
    lost = Finding("missing_dump", no_dump, group=group, seq=seq, op=op, t=t, detail=detail,
                   evidence={"blocked": blocked})
    own = f"{fmt_ranks(no_dump)} died of {'its' if len(no_dump) == 1 else 'their'} own"
    if _blind_survivors(no_dump, ts):
        _one_of(lost, detail, range(ts.world_size or 0), (
            " The other dumps hold no call at all, and none can show a send or recv (Gloo's Flight Recorder "
            "records none): nothing says what the job did when it went. It may have died of its own, or of a "
            "peer's message of another size or dtype (Gloo aborts the process that receives one)."))
    elif blind := _blind_senders(no_dump, ts):
        _one_of(lost, detail, blind, (
            f" {fmt_ranks(blind)} left {'a dump that holds' if len(blind) == 1 else 'dumps that hold'} no call and "
            f"cannot show a send or recv (Gloo's Flight Recorder records none), in a job that sends and receives: "
            f"{'it' if len(blind) == 1 else 'any of them'} may have sent {fmt_ranks(no_dump)} a message of another "
            f"size or dtype (Gloo aborts the process that receives one), or {own}."))
    elif unvouched := _unvouched_senders(no_dump, ts):
        _one_of(lost, detail, unvouched, (
            f" {fmt_ranks(unvouched)} sent {fmt_ranks(no_dump)} a message after which nothing with "
            f"{'it' if len(no_dump) == 1 else 'them'} completed, a message no two earlier sends carried (a "
            f"pipeline's first exchanges): nothing says it was the usual one. It may have been of another size or "
            f"dtype (Gloo aborts the process that receives one), or {own}."))
    return lost


def _one_of(lost: Finding, detail: str, others, why: str) -> None:
    """The lost ranks' finding, undecided between them and `others`, and why."""
    lost.evidence.update(undecided=True, suspects=sorted(set(lost.ranks) | set(others)))
    lost.detail = f"one of {fmt_ranks(lost.evidence['suspects'])}: {detail}{why}"


def _unvouched_senders(no_dump: list[int], ts: TraceSet) -> list[int]:
    """Survivors whose own trace shows a send to a lost rank after which no call with it completed, whose message
    no two earlier sends to it carried (fuzz run 76-275: a pipeline stage retyped its first gradient send, and
    the receiver Gloo aborted was named alone): it may be the message that killed it. parted.py names a sender
    whose odd message stands against two usual ones; where none stand, nothing vouches for it. None where the
    launcher's log says the lost ranks ended of their own."""
    found = []
    for r, t in ts.ranks.items():
        calls = p2p_entries(t)
        for lost in no_dump:
            es = [e for e in calls if e.peer == lost]
            sends = [i for i, e in enumerate(es) if e.op == "send"]
            if not sends or any(e.state == "completed" for e in es[sends[-1] + 1:]):
                continue
            last = message_of(es[sends[-1]])
            if sum(1 for i in sends[:-1] if message_of(es[i]) == last) < 2:
                found.append(r)
                break
    return [] if not found or set(no_dump) <= set(ended_on_their_own(ts)) else sorted(found)


def _blind_survivors(no_dump: list[int], ts: TraceSet) -> bool:
    """Every survivor's dump holds no call and cannot show p2p (Gloo's Flight Recorder: a pipeline's dumps are
    empty), and the launcher's log does not say the lost ranks ended of their own (a signal it did not send but
    an abort, an exit code, their own exception): their missing dump is then all there is, which cannot tell a
    rank that died of its own from one a peer's message killed."""
    survivors = list(ts.ranks.values())
    if not survivors or any(t.entries for t in survivors) or not all(shows_no_p2p(t) for t in survivors):
        return False
    return not set(no_dump) <= set(ended_on_their_own(ts))


def _blind_senders(no_dump: list[int], ts: TraceSet) -> list[int]:
    """Survivors whose dumps hold no call and cannot show p2p, beside others' traces that show sends and receives
    (a pipeline's mixed dumps: fuzz run 75-210, where the stage that resized its send left Gloo's Flight Recorder
    dump and the receiver Gloo aborted was named alone): any of them that may be a peer of theirs (as far from
    them as the peers the other traces show are from their ranks: a pipeline's neighbours) may have sent the lost
    ranks the message that killed them. None where the launcher's log says the lost ranks ended of their own."""
    survivors = ts.ranks
    offsets = {abs(e.peer - r) for r, t in survivors.items() for e in t.entries[-256:]
               if e.is_p2p and e.peer is not None}
    blind = [r for r, t in survivors.items() if not len(t.entries) and shows_no_p2p(t)
             and any(abs(r - lost) in offsets for lost in no_dump)]  # a peer of theirs, as the others' peers are
    if not blind:
        return []
    return [] if set(no_dump) <= set(ended_on_their_own(ts)) else sorted(blind)


def hedge_lost(lost: Finding | None, d: Divergence, idle: list[int], view, no_dump: list[int],
               pending: dict[int, list[Entry]], ts: TraceSet) -> None:
    """Ranks with no trace beside ranks that, alive, never issued the call the others wait in: either may have
    stopped the job (Gloo aborts a process, SIGABRT and no dump, whose peer passes a call of another kind or size:
    a rank that skipped or changed a call costs its peer its dump). So may the one rank in that call, when it is
    alone there (`_lone_caller`). The lost ranks' finding says so."""
    lost_here = [r for r in no_dump if r in view.members]
    if lost is None or not lost_here or lost.evidence.get("undecided"):
        return
    lone = _lone_caller(d, idle)
    suspects = sorted(set(lost_here) | set(idle) | set(lone))
    lost.evidence.update(undecided=True, suspects=suspects)
    if len(d.present) > len(idle) and not any(pending.get(r) for r in idle) and \
            all(_moved_past(view, r) and _blind_to_cpp(ts, r) for r in idle):
        lost.evidence["suspects_in_no_call"] = sorted(idle)  # their own traces show them past the call, in none
    alone = (f" {fmt_ranks(lone)} alone issued it: one call more of its own reaches its peers in their next call, "
             f"and Gloo aborts the peer that receives data of another size." if lone else "")
    lost.detail = (f"one of {fmt_ranks(suspects)}: " + lost.detail + f" {fmt_ranks(idle)}, alive, never issued "
                   f"{d.op} #{d.seq} on group '{d.group}' either: a rank that skipped or changed a call can cost its "
                   f"peer its dump (Gloo aborts a process whose peer passes a call of another kind or size), and a "
                   f"rank that died leaves the others waiting." + alone + " These traces do not say which came first.")


def _lone_caller(d: Divergence, idle: list[int]) -> list[int]:
    """The rank in the call the others never issued, when it is the only one there: it may have issued one call
    more (a call issued twice) that a peer, further on, took for its next one and died of, while the members
    outside it are merely behind. Two ranks that agree on the call outvote that reading (one fault does not make
    two ranks issue the same extra call); one rank inside against one or more outside does not."""
    return list(d.present) if len(d.present) == 1 and idle else []


def _blind_to_cpp(ts: TraceSet, rank: int) -> bool:
    """Whether the rank's trace is the recorder's alone, which cannot see calls issued from C++: a rank that
    skipped a Python call and went on into one of those (the next step's gradient buckets) shows as in no call
    there. Flight Recorder numbers every call: a rank it shows in no call issued none after, and its absence is
    that of a rank behind (or stopped), no better evidence than a peer's missing dump."""
    return ts.ranks[rank].source == "native"


def _moved_past(view, rank: int) -> bool:
    """Whether `rank`'s trace shows it under way on the group, so that its absence from the call the others wait
    in is its own doing: it made calls there before. A rank that recorded no call on the group yet may merely be
    late (still starting: a slow import under load) and says nothing against the lost rank."""
    return bool(view.by_rank.get(rank))
