"""Who is lost, and why: one blame policy for every world, over the facts each way of getting a world can see.

The standalone parent sees exit codes, its workers' event files and when each made progress; under a launcher
the reporter sees the store (outcomes, phases, heartbeats). Each turns what it saw into one `RankEnd` per rank;
`judge` decides from those alone:

1. A rank that returned has a result.
2. A rank whose function raised: a communication failure (failures.py: a timeout, a lost peer, an aborted
   collective, the launcher stopping it) makes it a victim, kept in `errors`; anything else is its own fault:
   lost, `raised <error>`.
3. A rank with no outcome is lost with what was seen of it: `never started` / `unreachable: never joined`,
   `hung: no progress for N s`, `exited with code C` (it ended first, on its own), `exited or unreachable: no
   heartbeat for N s`. One still inside its step, for less than a timeout, when the report is made is a victim
   (`still running ...`): most likely waiting for a rank that is gone. One the launcher stopped after another
   rank failed is collateral.
4. When only victims and collateral are left: if every failing rank timed out waiting while the collateral
   ranks never errored at all, the collateral ranks were not in the collective the others waited in: they hung.
   Otherwise the victims are all that explains the failure and are named (`timed out waiting for peers: ...`,
   `unreachable: ...`).
5. A lost rank that was in no phase of its own (lost between two collectives) is named with the collective the
   survivors were left waiting in: the one it never joined.
6. Nothing explains the failure and the world itself did not start: rank 0 is named with the start error.
"""

from __future__ import annotations

import signal
import socket
from collections import Counter
from dataclasses import dataclass, field

from distdoctor.world.failures import is_comm_failure, is_timeout
from distdoctor.world.result import JobResult, LostRank

# What was seen of a rank that left no outcome of its own.
NEVER_STARTED = "never_started"  # no sign of it ever running (`why` says how that is worded)
HUNG = "hung"  # alive, silent for longer than a timeout (`seconds` without progress)
EXITED = "exited"  # it ended on its own, first (`exit_code`)
GONE = "gone"  # its heartbeat stopped: exited or unreachable (`seconds` since the last one)
RUNNING = "running"  # alive and inside its step for less than a timeout when the report was made
STOPPED = "stopped"  # stopped by the launcher after another rank failed (`seconds` without progress)

# Reasons that name a rank only because nothing else explains the failure (rule 4): what a caller folding a
# JobResult with its own evidence (validate's skipped calls) may treat as collateral.
VAGUE_REASONS = ("exited", "timed out", "unreachable")


@dataclass
class RankEnd:
    """The facts about one rank at the end of a job, before any judgement."""

    rank: int
    host: str = "?"
    phase: str | None = None  # its last phase
    records: list = field(default_factory=list)
    outcome: dict | None = None  # its own word: {"ok": True, "value": v} or {"ok": False, "error": e, "phase": p}
    fate: str | None = None  # without an outcome: one of the constants above
    seconds: float | None = None
    exit_code: int | None = None
    why: str | None = None  # NEVER_STARTED: the words for it


def exit_reason(code: int | None) -> str:
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"exited with code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"exited with code {code}"
    return f"exited with code {code}"


def is_vague(reason: str) -> bool:
    """A reason that only says the rank stopped answering (rule 4), as opposed to a cause of its own."""
    return reason == "exited" or reason.startswith(VAGUE_REASONS[1:])


def judge(ends: list[RankEnd], result: JobResult, world_error: str | None = None) -> JobResult:
    """Fill `result` (results, records, phases, errors, lost, ok) from the facts about every rank."""
    victims: dict[int, str | None] = {}  # survivors left waiting -> the phase they were in
    collateral: list[RankEnd] = []
    never: set[int] = set()
    for end in ends:
        r = end.rank
        result.records[r] = end.records
        result.phases[r] = end.phase
        outcome = end.outcome
        if outcome is not None and outcome.get("ok"):
            result.results[r] = outcome.get("value")
            continue
        in_op = (outcome or {}).get("phase") or end.phase
        if outcome is not None:
            result.errors[r] = outcome["error"]
            if is_comm_failure(outcome["error"]):
                victims[r] = in_op
            else:
                result.lost.append(LostRank(r, end.host, f"raised {outcome['error']}", in_op))
        elif end.fate == NEVER_STARTED:
            never.add(r)
            result.lost.append(LostRank(r, end.host, end.why or "never started", None))
        elif end.fate == HUNG:
            result.lost.append(LostRank(r, end.host, f"hung: no progress for {end.seconds:.0f} s", in_op))
        elif end.fate == EXITED:
            result.lost.append(LostRank(r, end.host, exit_reason(end.exit_code), in_op))
        elif end.fate == GONE:
            result.lost.append(LostRank(r, end.host, f"exited or unreachable: no heartbeat for {end.seconds:.0f} s",
                                        in_op))
        elif end.fate == RUNNING:
            result.errors[r] = f"still running {in_op or 'its job'} when the report was made"
            victims[r] = in_op
        else:
            collateral.append(end)
    by_rank = {end.rank: end for end in ends}
    timed_out = [r for r in victims if is_timeout(result.errors[r])]
    if not result.lost and timed_out and collateral:
        for end in collateral:
            result.lost.append(LostRank(end.rank, end.host, f"hung: no progress for {end.seconds or 0:.0f} s",
                                        end.phase))
    if not result.lost and victims:
        for r in victims:
            error = result.errors[r]
            if error.startswith("still running"):
                reason = error
            else:
                reason = f"{'timed out waiting for peers' if is_timeout(error) else 'unreachable'}: {error}"
            result.lost.append(LostRank(r, by_rank[r].host, reason, by_rank[r].phase))
    name_the_collective_missed(result, victims, never)
    if world_error and not result.lost:
        result.lost.append(LostRank(0, socket.gethostname(), f"world did not start: {world_error}", None))
    result.lost.sort(key=lambda lr: lr.rank)
    result.ok = len(result.results) == result.world_size and not result.lost and not result.errors
    return result


def name_the_collective_missed(result: JobResult, victims: dict[int, str | None], never: set[int] = frozenset()) -> None:
    """A rank lost between two collectives has no phase of its own; the collective it failed to join is the one
    the survivors were left waiting in (their most common phase), so that is the one the report names for it.
    `victims`: survivor rank -> the phase it was in; `never`: ranks that never started (they were in nothing)."""
    waiting = Counter(phase for phase in victims.values() if phase)
    if not waiting:
        return
    missed = waiting.most_common(1)[0][0]
    for lr in result.lost:
        if lr.in_op is None and lr.rank not in victims and lr.rank not in never:
            lr.in_op = missed
