"""A collective completes only when every member issued it: a retirement a member's final trace refutes is a failure.

Gloo's Flight Recorder retires a work when it ends, whether it succeeded or failed (the peer's connection closed,
the call timed out or was aborted), and records no completion time; only NCCL's dumps tell the two apart (a
completion time read from the device). A rank whose dump was written after its call failed therefore shows the
call it was stuck in as completed, and itself as idle, past the call. The other members' traces can refute it: a
member whose process ended (its dump's reason says so: an exception, an exit, a signal) and whose trace holds no
call at that place never issued it, so no member could have completed it. Such a retirement is read back as the
call in flight when the dump was written: the rank was in it, waiting for the member that never came.

Only retirements without a completion time are read so (a completion NCCL or the recorder measured is kept), only
against a member whose trace is final (a live or requested dump may predate a call it issued later) and at a place
that member's recorder would have shown (not one of its `unseen` calls, issued from C++, align_ranks.py).
"""

from __future__ import annotations

from dataclasses import replace

from distdoctor.trace.model import RankTrace, TraceSet

# The recorder's dump reasons of a process that ended (recorder/ring.py, recorder/watchdog.py): a requested dump
# ("signal: SIGUSR1", "manual", a live answer) is a picture of a running rank, not its last word.
_FINAL = ("exception:", "exit:", "signal:")
_REQUESTS = ("signal: SIGUSR1", "signal: SIGUSR2")


def _final(t: RankTrace) -> bool:
    reason = t.dump_reason or ""
    return reason.startswith(_FINAL) and not reason.startswith(_REQUESTS)


def _last_issued(t: RankTrace) -> dict[str, int]:
    """group -> the highest collective number the rank's trace holds."""
    last: dict[str, int] = {}
    for e in t.entries:
        if e.seq is not None and not e.is_p2p:
            last[e.group] = max(last.get(e.group, 0), e.seq)
    return last


def _refuter(ts: TraceSet, rank: int, group: str, seq: int, ended: dict[int, dict[str, int]]) -> int | None:
    """A member of `group` whose final trace shows it never issued call `seq` there, or None."""
    info = ts.ranks[rank].groups.get(group)
    for member in (info.ranks if info else ()):
        last = ended.get(member)
        if member == rank or last is None or group not in last:
            continue
        if last[group] < seq and ts.ranks[member].would_show(group, seq):
            return member
    return None


def _retired_after(t: RankTrace, floor: dict[str, int]) -> list[int]:
    """Positions of the collectives `t` shows retired without a completion time beyond an ended member's last
    call on their group (read by column: a large dump builds no entry it does not need)."""
    cols = [t.column(name) for name in ("state", "t_completed", "seq", "group", "op")]
    return [i for i, (state, done, seq, group, op) in enumerate(zip(*cols))
            if state == "completed" and done is None and seq is not None and op not in ("send", "recv")
            and group in floor and seq > floor[group]]


def refute_completions(ts: TraceSet) -> list[dict]:
    """Read back each retirement a final member's trace refutes as the call in flight. Returns, per rank, the
    first call so read: {rank, group, seq, never_issued_by} (the report's `retired_in_flight`)."""
    ended = {r: _last_issued(t) for r, t in ts.ranks.items() if _final(t)}
    if not ended:
        return []
    floor: dict[str, int] = {}  # group -> the lowest last call of an ended member: no call at or below it is refuted
    for last in ended.values():
        for group, seq in last.items():
            floor[group] = min(floor.get(group, seq), seq)
    found: dict[int, dict] = {}
    for rank, t in ts.ranks.items():
        if not t.source.startswith("flight_recorder") and "flight_recorder_only" not in (t.merged or {}):
            continue
        changed = None
        for i in _retired_after(t, floor):
            e = t.entries[i]
            member = _refuter(ts, rank, e.group, e.seq, ended)
            if member is None:
                continue
            changed = list(t.entries) if changed is None else changed
            changed[i] = replace(e, state="issued")  # what a Gloo dump taken in flight shows
            found.setdefault(rank, {"rank": rank, "group": e.group, "seq": e.seq, "never_issued_by": member})
        if changed is not None:
            t.entries, t.summary = changed, None
    return [found[r] for r in sorted(found)]

