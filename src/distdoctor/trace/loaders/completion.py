"""A collective completes only when every member issued it: a retirement a held member's trace refutes is a failure.

Gloo's Flight Recorder retires a work when it ends, whether it succeeded or failed (the peer's connection closed,
the call timed out or was aborted), and records no completion time; only NCCL's dumps tell the two apart (a
completion time read from the device). A rank whose dump was written after its call failed therefore shows the
call it was stuck in as completed, and itself as idle, past the call. The other members' traces can refute it: a
member whose process ended (its dump's reason says so: an exception, an exit, a signal) and whose trace holds no
call at that place never issued it, so no member could have completed it. Such a retirement is read back as the
call in flight when the dump was written: the rank was in it, waiting for the member that never came.

A member whose process had not ended refutes it too when it was held: waiting in a call (in flight, or one of
these retirements read back) that a held member never issued. Calls block (Gloo's; NCCL's in-flight calls hold
nothing, their CPU goes on), so such a member issued nothing after its trace either: going on would need the call
it waited in to complete, which needs that member to issue it after its own trace, and so on, along a chain that
ends at a rank whose process ended, or around a cycle back to itself, which is impossible. This is how a hang's
dumps read when the launcher killed the ranks one by one and each survivor, its peer's connection closed, wrote
its dump again from its exception handler: every dump is a retirement or a wait, none says it is final, and the
cycle they form holds them all.

A bare Flight Recorder dump (no dump reason: it never says whether its process ended) of a rank in no call can
end such a chain too, for ranks that each wait in their last call: read as a picture of a rank that went on, it
makes every other dump of the chain a stale one (each retirement a call the member issued after its dump); read
as the rank's last word, no dump is stale. Two tensor-parallel runs read so named a rank held by the stopped one.

Only retirements without a completion time are read so (a completion NCCL or the recorder measured is kept), only
against a member held so (a live or requested dump of a rank that could go on may predate a call it issued later)
and at a place that member's recorder would have shown (not one of its `unseen` calls, issued from C++,
align_ranks.py).
"""

from __future__ import annotations

from dataclasses import replace

from distdoctor.trace.frontier import is_async
from distdoctor.trace.model import RankTrace, TraceSet
from distdoctor.trace.summary import summarize

# The recorder's dump reasons of a process that ended (recorder/ring.py, recorder/watchdog.py): a requested dump
# ("signal: SIGUSR1", "manual", a live answer) is a picture of a running rank, not its last word.
_FINAL = ("exception:", "exit:", "signal:")
_REQUESTS = ("signal: SIGUSR1", "signal: SIGUSR2")


def _final(t: RankTrace) -> bool:
    reason = t.dump_reason or ""
    return reason.startswith(_FINAL) and not reason.startswith(_REQUESTS)


def _frontier(t: RankTrace) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """(group -> the highest collective number the rank's trace holds, the collectives it shows in flight), from
    the trace's summary: a large or streamed dump reads no entry but those in flight."""
    s = summarize(t)
    last = {group: max(seqs) for group, seqs in s.by_group.items() if seqs}
    inflight = []
    for p in s.not_done:
        e = t.entries[p]
        if e.seq is not None and e.op not in ("send", "recv"):
            inflight.append((e.group, e.seq))
    return last, inflight


def _lacks(ts: TraceSet, member: int, group: str, seq: int, last: dict[int, dict[str, int]]) -> bool:
    """Whether `member`'s trace shows it never issued call `seq` on `group` (it holds earlier calls there, and
    would have shown this one)."""
    mine = last.get(member, {})
    return group in mine and mine[group] < seq and ts.ranks[member].would_show(group, seq)


def _members(ts: TraceSet, rank: int, group: str) -> list[int]:
    info = ts.ranks[rank].groups.get(group)
    return [m for m in (info.ranks if info else ()) if m != rank and m in ts.ranks]


def _retired_after(t: RankTrace, floor: dict[str, int], mine: dict[str, int]) -> list[int]:
    """Positions of the collectives `t` shows retired without a completion time beyond some member's last call on
    their group: only the calls between that floor and the rank's own last (`mine`) are looked at, not its whole
    buffer (this runs on every load)."""
    out = []
    for group, seqs in summarize(t).by_group.items():
        top = mine.get(group, 0)
        for seq in range(floor.get(group, top) + 1, top + 1):
            p = seqs.get(seq)
            if p is not None and t.entries[p].state == "completed" and t.entries[p].t_completed is None:
                out.append(p)
    return sorted(out)


def _held(ts: TraceSet, last: dict, waits: dict[int, list[tuple[str, int]]], final: set[int],
          ends: set[int], at_last: set[int]) -> set[int]:
    """The ranks that issued nothing after their trace: those whose process ended, and the largest set of ranks
    each waiting (in flight, or retired without a completion time) in a call a member of that set, or an ended
    one, never issued. Calls block, so a rank past its trace would have finished the call it waited in, which
    needs that member to issue it after its own trace, and so on: along a chain that ends at an ended rank, or
    around a cycle, that is impossible. A chain may also end at one of `ends` (`_open_ends`) for a rank that
    waits in its last call (`at_last`)."""
    lackers = {r: {m for g, s in calls for m in _members(ts, r, g) if _lacks(ts, m, g, s, last)}
               for r, calls in waits.items() if calls}  # whom each rank waits for: read once, not each pass
    held = final | {r for r, who in lackers.items() if who}
    changed = True
    while changed:
        changed = False
        for rank in sorted(held - final):
            if not lackers[rank] & held and not (rank in at_last and lackers[rank] & ends):
                held.discard(rank)
                changed = True
    return held


def _open_ends(ts: TraceSet, fronts: dict, lacked: dict[int, list[int]]) -> set[int]:
    """Bare Flight Recorder dumps (no dump reason: they never say whether the process ended) of ranks in no call
    that blocks. Such a dump may be a picture of a rank that went on; then each call other ranks retired that it
    lacks is one it issued after its dump, and so is every call those ranks retired lacking them in turn: every
    dump of the chain but the last a stale one. Read as the rank's last word instead, no dump is stale: the
    retirements are the calls that failed under the ranks waiting in them. Taken only where each rank of the
    chain waits in its last call (`_at_last`): a rank that went on past a call it retired completed it."""
    return {r for r, t in ts.ranks.items() if t.source.startswith("flight_recorder") and not t.dump_reason
            and not fronts[r][1] and not is_async(t) and not lacked.get(r)}


def _at_last(ts: TraceSet, fronts: dict, lacked: dict[int, list[int]]) -> set[int]:
    """Ranks whose one wait is their last call: nothing in flight, and the one retirement a member lacks at the end
    of their trace."""
    return {r for r, positions in lacked.items() if not fronts[r][1] and positions == [len(ts.ranks[r].entries) - 1]}


def _lacked(ts: TraceSet, retired: dict[int, list[int]], last: dict) -> dict[int, list[int]]:
    """rank -> the positions of its retirements that some member's trace lacks, read once."""
    out = {}
    for r, positions in retired.items():
        entries = ts.ranks[r].entries
        out[r] = [i for i in positions if any(_lacks(ts, m, entries[i].group, entries[i].seq, last)
                                              for m in _members(ts, r, entries[i].group))]
    return out


def _retirements(ts: TraceSet, last: dict) -> dict[int, list[int]]:
    """rank -> positions of the Flight Recorder retirements without a completion time that some member's trace
    lacks: the calls that may have failed rather than completed."""
    floor: dict[str, int] = {}  # group -> the lowest last call of any rank: no call at or below it is refuted
    for mine in last.values():
        for group, seq in mine.items():
            floor[group] = min(floor.get(group, seq), seq)
    out = {}
    for rank, t in ts.ranks.items():
        if t.numbered_by_communicator:
            out[rank] = _retired_after(t, floor, last[rank])
    return out


def refute_completions(ts: TraceSet) -> list[dict]:
    """Read back each retirement a held member's trace refutes as the call in flight. Returns, per rank, the first
    call so read: {rank, group, seq, never_issued_by}, and `member_waits_in` {group, seq} where that member's
    process had not ended but it was itself held in a call (the report's `retired_in_flight`)."""
    fronts = {r: _frontier(t) for r, t in ts.ranks.items()}
    last = {r: f[0] for r, f in fronts.items()}
    retired = _retirements(ts, last)
    if not any(retired.values()):
        return []
    # Only a call that blocks holds its rank: NCCL's return before the GPU is done (trace/frontier.py)
    waits = {r: [] if is_async(ts.ranks[r]) else list(f[1]) for r, f in fronts.items()}
    for rank, positions in retired.items():
        waits[rank] += [(ts.ranks[rank].entries[i].group, ts.ranks[rank].entries[i].seq) for i in positions]
    final = {r for r, t in ts.ranks.items() if _final(t)}
    lacked = _lacked(ts, retired, last)
    ends, at_last = _open_ends(ts, fronts, lacked), _at_last(ts, fronts, lacked)
    held = _held(ts, last, waits, final, ends, at_last)
    found: dict[int, dict] = {}
    for rank, positions in retired.items():
        t = ts.ranks[rank]
        changed = None
        stops = held | (ends if rank in at_last else set())
        for i in positions:
            e = t.entries[i]
            member = next((m for m in _members(ts, rank, e.group) if m in stops and _lacks(ts, m, e.group, e.seq, last)),
                          None)
            if member is None:
                continue
            changed = list(t.entries) if changed is None else changed
            changed[i] = replace(e, state="issued")  # what a Gloo dump taken in flight shows
            found.setdefault(rank, {"rank": rank, "group": e.group, "seq": e.seq, "never_issued_by": member,
                                    **_held_in(member, final, waits)})
        if changed is not None:
            t.entries, t.summary = changed, None
    return [found[r] for r in sorted(found)]


def _held_in(member: int, final: set[int], waits: dict[int, list[tuple[str, int]]]) -> dict:
    """Where a member that had not ended was held: its first call in flight, or else its first retirement read
    back."""
    if member in final or not waits[member]:
        return {}
    group, seq = waits[member][0]
    return {"member_waits_in": {"group": group, "seq": seq}}
