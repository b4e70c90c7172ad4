"""Findings in text and JSON, one renderer for `diagnose` and `sim` (distdoctor/findings/kinds.py: the one
vocabulary): the same finding reads the same whoever found it."""

from __future__ import annotations

from distdoctor.findings.kinds import Finding, fmt_group

# Kinds about streams, threads or messages rather than a group's call: no "on <group>" when they name none.
NO_GROUP = frozenset({"stuck_thread", "stream_deadlock", "stream_starved", "crossed_p2p"})


def findings_json(findings: list[Finding]) -> list[dict]:
    return [f.to_json() for f in findings]


def where(f: Finding) -> str:
    """' at <op> #<seq> on <group>', as far as the finding knows it."""
    if f.op is None:  # a hazard across groups (lint) names them
        if len(f.groups) > 1 or (f.groups and f.group is None):
            return " on groups " + ", ".join(repr(g) for g in f.groups)
        return ""
    return f" at {f.op}" + (f" #{f.seq}" if f.seq is not None else "") + \
        (f" on {fmt_group(f.group)}" if f.group is not None or f.kind not in NO_GROUP else "")


def finding_lines(findings: list[Finding], indent: str = "", limit: int | None = None,
                  blank: bool = True) -> list[str]:
    """Each finding numbered, its kind, ranks and where, then its sentence; past `limit`, a count."""
    lines: list[str] = []
    for i, f in enumerate(findings[:limit] if limit is not None else findings, 1):
        if blank:
            lines.append("")
        lines.append(f"{indent}{i}. {f.kind}: ranks {f.ranks}{where(f)}")
        lines.append(f"{indent}   {f.detail}")
    if limit is not None and len(findings) > limit:
        lines.append(f"{indent}... and {len(findings) - limit} more findings (--format json lists all)")
    return lines
