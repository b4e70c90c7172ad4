"""Members a call cannot be proven absent from: a recorder-only rank beside Flight Recorder ranks does not see
the calls issued from C++ (`RankTrace.unseen`, trace/loaders/align_ranks.py). Its trace ending before such a
call is no proof it never came: neither present nor absent, unless it is the one member a call nobody
completed can wait for, or it is in no collective at all (its main thread outside torch) while a member still
waits in the call: had it issued the call, from C++ or not, it would be in it, or the call would have completed
on that member too (a member whose own watchdog saw it in the call waits in it, its trace holding it or not; a
member whose trace would show the call never issued it, and the others' completion is Gloo's untimed
retirement: no proof they did not fail in it, waiting)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distdoctor.diagnose.progress import header_call, outside_torch
from distdoctor.findings.kinds import fmt_ranks
from distdoctor.trace.model import Entry, RankTrace

if TYPE_CHECKING:  # (a type only: match.py imports this module)
    from distdoctor.diagnose.match import GroupView


def mark_unseen(views: dict, rank: int, trace: RankTrace) -> None:
    """What this module reads of a rank's trace, on its groups' views: the calls it cannot see (`unseen`), whether
    it is in no collective at all (`outside`), and the collective its own watchdog saw it blocked in
    (`watched_in`: the hang header names a call its trace may not hold, hang_status.py, by Flight Recorder's
    numbering: read where the trace was placed among Flight Recorder ranks, whose numbers the views then use)."""
    outside, held = bool(trace.unseen) and outside_torch(trace), header_call(trace)
    for name in (trace.unseen or {}).keys() & views.keys():  # (RankTrace.unseen: see trace/loaders/align_ranks.py)
        if views[name].members and rank not in views[name].members:
            continue  # (a group the rank is not in: nothing of it is the rank's to see)
        views[name].unseen[rank] = trace.unseen[name]
        if outside:
            views[name].outside.add(rank)
    if held is not None and held["group"] in views and held["op"] not in ("send", "recv") and trace.classified:
        views[held["group"]].watched_in[rank] = (held["seq"], held["op"])  # (numbered as its Flight Recorder peers)


def absent_from(view: GroupView, seq: int, present: dict[int, Entry], behind: list[int]) -> list[int]:
    """Of the members whose trace ends before collective `seq` (`behind`), those that never issued it."""
    unseen = [r for r in behind if seq in view.unseen.get(r, ())]
    if not unseen:
        return behind
    absent = [r for r in behind if r not in unseen]  # members whose trace would show it: they never issued it
    if any(not view.is_done(q, e) for q, e in present.items()) or \
            any(s == seq for s, _ in view.watched_in.values()) or _unproven(present, absent):
        unseen = [r for r in unseen if r not in view.outside]  # a member still waits in it: those in no call at
        absent = [r for r in behind if r not in unseen]  # all never issued it
    if not absent and _only_one_can_be_missing(view, present, unseen):
        return unseen
    return absent


def _unproven(present: dict[int, Entry], absent: list[int]) -> bool:
    """The present members show the call retired, without a completion time (Gloo's Flight Recorder retires a
    call that failed as one that completed), and a member whose trace would show the call never issued it: no
    proof it completed - they may have failed in it as the job was ended, waiting for that member."""
    return bool(absent) and all(e.state == "completed" and e.t_completed is None for e in present.values())


def _only_one_can_be_missing(view: GroupView, present: dict[int, Entry], unseen: list[int]) -> bool:
    """Every member left a trace, all but one hold the call, nobody completed it: the one member whose trace
    cannot see it is the one it waits for (had it come, the call would have completed)."""
    return len(unseen) == 1 and set(view.members) <= set(view.by_rank) and \
        len(present) + 1 >= len(view.members) and not any(view.is_done(r, e) for r, e in present.items())


def blind_completion(view: GroupView, seq: int, done: list[int], stuck: list[int]) -> dict | None:
    """Collective `seq` completed on `done` but `stuck` are still in it, and every rank of `done` left only the
    recorder's trace, which cannot see calls the stuck ranks hold before `seq`. Had the done ranks issued those
    calls (from C++), their `seq` would have met the stuck ranks' and completed there too: the two sides made a
    different number of calls among them (the done ranks one fewer, or the stuck ranks one more), and their
    later calls met one off. The side with fewer members is the odd one; two even sides are "one of".
    Returns what the finding should say (kind, ranks, seq, candidates), else None."""
    if not done or not stuck or any(r not in view.unseen for r in done):
        return None
    blind = set.intersection(*(set(view.unseen[r]) for r in done))
    calls = sorted(u for u in blind if u < seq and all(u in view.by_rank.get(r, {}) for r in stuck))
    if not calls:
        return None
    if len(done) < len(stuck):
        return {"kind": "missing_ranks", "ranks": sorted(done), "seq": calls[-1], "calls": calls}
    if len(done) == len(stuck):
        return {"kind": "state_mismatch", "ranks": sorted(done + stuck), "seq": seq, "calls": calls,
                "undecided": True}
    return None


def blind_detail(blind: dict, group: str, op: str) -> str:
    """Why a completion the others are still in says the two sides made a different number of calls
    (match._weigh_blind)."""
    calls = ", ".join(f"#{u}" for u in blind["calls"][-5:])
    done, stuck = fmt_ranks(blind["completed"]), fmt_ranks(blind["stuck"])
    return (f"{op} #{blind['seq']} on {group} completed on {done} but {stuck} "
            f"{'is' if len(blind['stuck']) == 1 else 'are'} still in it, and {done} left only the recorder's "
            f"trace, which cannot see {calls} of {stuck}'s dump (a call issued from C++ is not seen). Had {done} "
            f"issued those calls, #{blind['seq']} would have completed on {stuck} too: {done} issued one fewer "
            f"call there, or {stuck} one more, and their later calls met one off.")
