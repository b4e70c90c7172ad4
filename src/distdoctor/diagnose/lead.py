"""Which finding leads: root cause first (findings.PRIORITY), then by when the evidence happened, then by ranks;
and where one finding's evidence decides another's "one of", the deciding one first."""

from __future__ import annotations

from distdoctor.diagnose.crash import comm_failed, stopped
from distdoctor.findings.kinds import PRIORITY, PRODUCER_ORDERED, Finding


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Root cause first (PRIORITY), then by when the evidence happened, then by ranks; kinds whose producer
    already orders them strongest first (PRODUCER_ORDERED) keep that order among themselves (the sort is stable)."""
    ordered = sorted(findings, key=lambda f: (_rank_of(f), f.t if f.t is not None else float("inf"),
                                              [] if f.kind in PRODUCER_ORDERED else sorted(f.ranks)))
    return _crash_decides(ordered)


def _crash_decides(findings: list[Finding]) -> list[Finding]:
    """A mismatch comes after the crash of its own of a member of that group, at that call or the next: the rank
    whose own code raised there (an argument error; a peer's mismatch makes a backend raise a communication
    failure, `EnforceNotMet`, which is not the rank's own) is the evidence that decides whose call differed,
    before what the sizes alone say ("one of" them; a minority; a scatter's root outvoted by nothing but the
    rule that the root's chunk is what every member receives) - unless the crashed rank's own value sides with
    a majority against the one rank the mismatch names (`_outvoted`)."""
    for i, f in enumerate(findings):
        if f.kind not in MISMATCH_KINDS:
            continue  # (one that names the crashed rank alone already says it: ties.py weighed the same error)
        j = next((j for j, g in enumerate(findings) if j > i and g.kind == "crashed" and len(g.ranks) == 1
                  and g.ranks != f.ranks and _raised_at(g, f) and _own_text(g) and not _outvoted(g, f)), None)
        if j is not None:
            return findings[:i] + [findings[j]] + [g for k, g in enumerate(findings[i:], i) if k != j]
    return findings


def _outvoted(g: Finding, f: Finding) -> bool:
    """The crashed rank passed what two or more other members passed, against the one rank the mismatch names:
    the members' own values decide, and what the crashed rank raised after the call is what it received from
    that rank (a garbage size it then failed to allocate, an object it failed to unpickle), not its own error."""
    crashed = g.ranks[0]
    if len(f.ranks) != 1:
        return False
    for by_value in filter(None, map(_sides, f.evidence.values())):
        side = next((v for v in by_value if crashed in v), None)
        if side is not None and len(side) >= 3 and f.ranks[0] not in side:
            return True
    return False


def _sides(told) -> list[list[int]] | None:
    """The members grouped by the value they passed, from a mismatch's evidence: {value: [ranks]} (dtypes) or
    {rank: value} (sizes); None for evidence of another shape."""
    if not isinstance(told, dict) or not told:
        return None
    if all(isinstance(v, list) and all(isinstance(r, int) for r in v) for v in told.values()) and \
            not all(isinstance(k, int) for k in told):
        return [list(v) for v in told.values()]
    if all(isinstance(k, int) for k in told):
        sides: dict[str, list[int]] = {}
        for rank, value in told.items():
            sides.setdefault(repr(value), []).append(rank)
        return list(sides.values())
    return None


def _raised_at(g: Finding, f: Finding) -> bool:
    """The crash was raised inside f's call, or after f's call was the rank's last completed one on its group."""
    at = g.evidence.get("raised_at") or {}
    return at.get("group") == f.group and f.seq is not None and at.get("seq") in (f.seq, f.seq + 1)


def _own_text(g: Finding) -> bool:
    """A crash finding's exception is the rank's own: no communication failure, no stop from outside."""
    crash = (g.evidence.get("exception") or {}).get(str(g.ranks[0])) or {}
    return bool(crash.get("text")) and not comm_failed(crash) and not stopped(crash)


MISMATCH_KINDS = ("type_mismatch", "size_mismatch", "dtype_mismatch", "root_mismatch")


def _rank_of(f: Finding) -> float:
    """PRIORITY, except that a lost rank hedged with ranks whose own traces show them absent from the call the
    others wait in and in no call at all (lost.py, `hedge_lost`: "one of ..."; they moved on past it, and fewer
    of them than the ranks in the call) comes after those ranks' missing_ranks: the evidence first, a missing
    dump (which says nothing of what the rank did) after it. A rank blocked elsewhere may be waiting, unseen, for
    the lost one: then the lost rank leads. And a call no other member made next (next_call.py) comes before the
    cycle of waits it makes: the others' next calls wait for its rank while it waits in its call for them."""
    if f.kind == "missing_dump" and f.evidence.get("undecided") and f.evidence.get("suspects_in_no_call"):
        return PRIORITY["missing_ranks"] + 0.5
    if f.evidence.get("parted") == "next_call":
        return PRIORITY["order_deadlock"] - 0.5
    return PRIORITY[f.kind]
