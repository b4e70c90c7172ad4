"""Findings in text and JSON, one renderer for `diagnose` and `sim` (distdoctor/findings/kinds.py: the one
vocabulary): the same finding reads the same whoever found it."""

from __future__ import annotations

from distdoctor.findings.kinds import Finding, fmt_group

# Kinds about streams, threads or messages rather than a group's call: no "on <group>" when they name none.
NO_GROUP = frozenset({"stuck_thread", "stream_deadlock", "stream_starved", "crossed_p2p"})
MAX_LISTED = 8  # rank lists longer than this are written as ranges


def findings_json(findings: list[Finding]) -> list[dict]:
    return [f.to_json() for f in findings]


def where(f: Finding, label=fmt_group) -> str:
    """' at <op> #<seq> on <group>', as far as the finding knows it (`label` names a group: the HTML report's
    adds what the user called it)."""
    if f.op is None:  # a hazard across groups (lint) names them
        if len(f.groups) > 1 or (f.groups and f.group is None):
            return " on groups " + ", ".join(repr(g) for g in f.groups)
        return ""
    return f" at {f.op}" + (f" #{f.seq}" if f.seq is not None else "") + \
        (f" on {label(f.group)}" if f.group is not None or f.kind not in NO_GROUP else "")


def finding_lines(findings: list[Finding], indent: str = "", limit: int | None = None,
                  blank: bool = True) -> list[str]:
    """Each finding numbered, its kind, ranks and where, then its sentence; past `limit`, a count."""
    lines: list[str] = []
    for i, f in enumerate(findings[:limit] if limit is not None else findings, 1):
        if blank:
            lines.append("")
        who = f.ranks if len(f.ranks) <= MAX_LISTED else f"{fmt_ranges(f.ranks)} ({len(f.ranks)} ranks)"
        lines.append(f"{indent}{i}. {f.kind}: ranks {who}{where(f)}")
        lines.append(f"{indent}   {f.detail}")
    if limit is not None and len(findings) > limit:
        lines.append(f"{indent}... and {len(findings) - limit} more findings (--format json lists all)")
    return lines


def findings_html(findings: list[Finding], label=fmt_group) -> str:
    """Each finding as an HTML block with the text report's words: its kind, ranks and where, then its sentence."""
    from html import escape

    out = []
    for f in findings:
        out.append(f"<div class='f'><span class='k'>{escape(f.kind)}</span> {escape(who(f.ranks) + where(f, label))}"
                   f"<br>{escape(f.detail)}</div>")
    return "\n".join(out)


def who(ranks) -> str:
    """'rank 3', or 'ranks 0-3, 7 (5)': the HTML report's rank labels."""
    ranks = sorted(set(ranks))
    if not ranks:
        return "no rank"
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {fmt_ranges(ranks)} ({len(ranks)})"


def fmt_ranges(ranks) -> str:
    """0,1,2,3,5,7,8,9 -> '0-3, 5, 7-9'; 0,8,...,1016 -> '0-1016 step 8': a big world's rank lists (a mesh
    dimension's ranks are evenly spaced) stay one readable line."""
    x = sorted(set(ranks))
    parts = []
    i = 0
    while i < len(x):
        j = i + 1
        if j < len(x):
            d = x[j] - x[i]
            while j + 1 < len(x) and x[j + 1] - x[j] == d:
                j += 1
            if d == 1 or j - i >= 2:  # consecutive ranks, or three and more evenly spaced
                parts.append(f"{x[i]}-{x[j]}" + (f" step {d}" if d > 1 else ""))
                i = j + 1
                continue
        parts.append(str(x[i]))
        i += 1
    return ", ".join(parts)
