"""Sends and receives that wait where the dumps cannot see: where can the chain of waits end?

Ranks wait in p2p for peers whose dumps cannot show p2p (Gloo's Flight Recorder records none): those peers may
never have posted the other half, or be blocked in p2p with others; absence of evidence. A chain of waits ends at
a rank that waits for nobody. The evidence that decides is a member shown stopped, alone: one that left the job
with its process group alive (its recorder dump says it exited, no destroy_process_group), or one its own
watchdog saw in no call for the hang's threshold (`progress.stopped_through_hang`). Else, in order: the launcher's
log naming who ended on its own, the connection that closed first (`ended.first_to_close`), or the one rank left
unaccounted for. Otherwise the verdict is "one of" the ranks where a chain can end: those the dumps cannot show,
and any rank in no call at all whose dump shows p2p, never left out for ranks the dumps cannot show.
Where no dump shows anyone waiting at all (every other rank left a dump that cannot show p2p), a confirmed hang
whose ranks' own watchdogs saw one of them in no call through it still names that rank (`stopped_in_hang`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from distdoctor.diagnose.crash import launch_phrase
from distdoctor.diagnose.ended import first_to_close
from distdoctor.diagnose.progress import in_no_call, left_alive, shows_no_p2p, stopped_through_hang, where_now
from distdoctor.findings.kinds import Finding, fmt_ranks
from distdoctor.trace.model import Entry, TraceSet


@dataclass
class Unseen:
    """One call some ranks wait in, for peers whose dumps cannot show p2p."""
    key: tuple  # (group, seq, op)
    entry: Entry
    waiters: list[int]
    peers: list[int]  # the ranks waited for, whose dumps show no p2p
    free: list[int]  # members with a dump, in no call the dumps show, not named by another finding
    where: str  # "recv #16 on the default group '0'"
    first_signalled: int | None  # the first rank a signal ended, where no watchdog called the job hung


@dataclass
class _Ends:
    """Where the chain of waits may end, by what shows it."""
    left: list[int]  # exited with the process group alive
    idle: dict[int, str]  # its own watchdog saw it in no call through the hang: rank -> how long
    signalled: set[int]  # the first rank a signal ended, in no call
    blind: list[int]  # dumps that cannot show p2p (and the first signalled)
    loose: list[int]  # blind, and ranks in no call at all whose dumps show p2p

    @property
    def shown(self) -> list[int]:
        return self.left + list(self.idle)


def _ends(ts: TraceSet, u: Unseen) -> _Ends:
    left = [m for m in u.free if left_alive(ts.ranks[m])]
    idle = {m: why for m in u.free if m not in left for why in [stopped_through_hang(ts.ranks[m])] if why}
    signalled = {u.first_signalled} & set(u.free)
    blind = sorted({m for m in u.free if shows_no_p2p(ts.ranks[m])} | set(u.peers) | signalled)
    loose = sorted(set(blind) | {m for m in u.free if m not in left and m not in idle and in_no_call(ts.ranks[m])})
    return _Ends(left, idle, signalled, blind, loose)


def _why(u: Unseen) -> str:
    many = len(u.peers) > 1
    peers = fmt_ranks(u.peers)
    return (f"{fmt_ranks(u.waiters)} wait{'' if len(u.waiters) > 1 else 's'} in {u.where} for {peers}, whose "
            f"dump{'s' if many else ''} (Gloo's Flight Recorder) record{'' if many else 's'} no send/recv: whether "
            f"{peers} posted the other half, or {'are' if many else 'is'} blocked in p2p with another rank, these "
            f"dumps cannot show")


def _one_of(ts: TraceSet, ends: _Ends, why: str) -> tuple[list[int], str]:
    ranks = sorted(ends.shown) or ends.loose
    notes = ([f"{fmt_ranks(ends.left)} left the job with the process group alive"] if ends.left else []) + [
        f"rank {r}: {why}" for r, why in ends.idle.items()] + [
        f"rank {r} is in no call ({where_now(ts.ranks[r]) or 'its stack outside torch'})"
        for r in ranks if r not in ends.blind and r not in ends.shown] + [
        f"rank {r} is the first a signal ended ({ts.ranks[r].dump_reason}), in no call"
        for r in sorted(ends.signalled) if r in ranks]
    return ranks, f"one of {fmt_ranks(ranks)}: {why}" + "".join(f"; {n}" for n in notes) + "."


def _decide(ts: TraceSet, u: Unseen, ends: _Ends, p2p_ends: tuple, own_ends: set[int],
            describe: Callable[[int], str]) -> tuple[list[int], str]:
    why = _why(u)
    shown = ends.shown
    if len(shown) == 1:
        how = ("it left the job while the others still wait" if ends.left else
               f"{ends.idle[shown[0]]}, while the others waited")
        return shown, (f"Suspected, because {describe(shown[0])}, while {why}; rank {shown[0]} is the only member "
                       f"whose dump shows it stopped: {how}.")
    if shown:
        return _one_of(ts, ends, why)
    own = sorted(own_ends) if own_ends <= set(ends.blind) else []  # (all of them: those with no dump too)
    if own and len(own) < len(ends.blind):
        went = "; ".join(f"rank {r}: {launch_phrase(ts.ranks[r])}" for r in own)
        return own, (f"Suspected, because {why}; the launcher's log says rank {own[0]} ended on its own ({went}) "
                     f"before it stopped the others: the first to go." if len(own) == 1 else
                     f"one of {fmt_ranks(own)}: {why}; the launcher's log says these went before it stopped the "
                     f"others ({went}), and not which went first.")
    gone = first_to_close(p2p_ends, ends.blind) if len(ends.blind) > 1 else None
    if gone is not None:
        return [gone[0]], (f"Suspected, because {why}; rank {gone[0]}'s end of the connection closed under rank "
                           f"{gone[1]}'s send/recv with it (its process ended), and rank {gone[2]}'s later dump "
                           f"still found {fmt_ranks([q for q in ends.blind if q != gone[0]])} connected: rank "
                           f"{gone[0]} ended first.")
    if len(ends.loose) == 1:
        return ends.loose, f"Suspected, because {why}; no other rank is unaccounted for."
    return _one_of(ts, ends, why)


def unseen_finding(ts: TraceSet, u: Unseen, p2p_ends: tuple, own_ends: set[int],
                   describe: Callable[[int], str]) -> Finding:
    """The `missing_ranks` finding for one call ranks wait in where the dumps cannot see p2p."""
    group, seq, op = u.key
    ends = _ends(ts, u)
    ranks, detail = _decide(ts, u, ends, p2p_ends, own_ends, describe)
    return Finding("missing_ranks", ranks, group=group, seq=seq, op=op, t=u.entry.t_created, detail=detail,
                   evidence={"waiting": u.waiters, "found_by": "wait-for graph", "no_p2p_in_dump": ends.blind,
                             **({"left_alive": ends.left} if ends.left else {}),
                             **({"stopped_in_hang": list(ends.idle)} if ends.idle else {}),
                             **({"undecided": True, "suspects": ranks} if len(ranks) > 1 else {})})


def stopped_in_hang(ts: TraceSet) -> Finding | None:
    """When nothing else is found: the ranks whose own watchdog saw them in no call through a suspected or
    confirmed hang (`progress.stopped_through_hang`), at the call the hang's detector was blocked in (the
    episode each header carries). The others' dumps may show nobody waiting (Gloo's Flight Recorder records no
    send/recv), yet the hang was confirmed and these ranks waited for nobody. A signal that ended them after
    it is the job's stop, not a cause (crash.signal_of_its_own)."""
    idle = {r: stopped_through_hang(t) for r, t in sorted(ts.ranks.items())}
    ranks = [r for r, why in idle.items() if why]
    if not ranks:
        return None
    hang = ts.ranks[ranks[0]].hang
    call = hang.get("blocked_in") if isinstance(hang.get("blocked_in"), dict) else {}
    group, seq, op = (str(call["group"]) if call.get("group") is not None else None), call.get("seq"), call.get("op")
    by = hang.get("detected_by")
    number = f" #{seq}" if seq is not None else ""
    where = (f", while rank {by} was blocked in {op}{number} on group '{group}' (the hang's detector, as each header "
             f"records)" if group is not None and op and by is not None else "")
    seen = "; ".join(f"rank {r}: {idle[r]}" + (f", now at {at}" if (at := where_now(ts.ranks[r])) else "")
                     for r in ranks)
    lead = f"Suspected, because {seen}" if len(ranks) == 1 else f"one of {fmt_ranks(ranks)}: {seen}"
    return Finding("missing_ranks", ranks, group=group, seq=seq, op=op, detail=(
        f"{lead}{where}. No dump shows another rank waiting for {'it' if len(ranks) == 1 else 'them'}: "
        f"the others cannot show where they stood."), evidence={"found_by": "hang watchdog", "stopped_in_hang": ranks,
                                                                **({"undecided": True, "suspects": ranks}
                                                                   if len(ranks) > 1 else {})})
