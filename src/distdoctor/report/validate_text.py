"""Text report of `distdoctor validate`: one compact table (one line per collective and group), the failures
in detail, and a verdict line that names the culprit ranks."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.table import Table

MAX_FAILURES_SHOWN = 15


def verdict_line(report: dict) -> str:
    rows = report["results"]
    n_pass = sum(r["status"] == "pass" for r in rows)
    n_skip = sum(r["status"] == "skipped" for r in rows)
    n_fail = sum(r["status"] == "fail" for r in rows)
    where = f"{report['world_size']} ranks, {report['backend']}"
    if report["passed"]:
        return f"PASS: {n_pass} checks passed, {n_skip} skipped, on {where}"
    culprits = report.get("culprits") or []
    if culprits:
        named = "; ".join(f"rank {c['rank']}: {_why(c['why'])}" for c in culprits)
    else:
        named = "no single rank stands out (every rank is affected)"
    n_notrun = sum(r["reason"].startswith("not run") for r in rows)
    counts = f"{n_fail} of {len(rows)} checks failed" + (f", {n_notrun} not run" if n_notrun else "")
    return f"FAIL on {where} ({counts}). Culprit: {named}"


def _why(reasons: list[str]) -> str:
    """'wrong result in 14 checks (first: ...)' rather than 14 near-identical sentences."""
    wrong = [r for r in reasons if r.startswith("wrong result in ")]
    other = [r for r in reasons if not r.startswith("wrong result in ")]
    parts = other[:2]
    if len(wrong) == 1:
        parts.append(wrong[0])
    elif wrong:
        parts.append(f"wrong result in {len(wrong)} checks (first: {wrong[0][len('wrong result in '):]})")
    return ", ".join(parts)


def _fmt_err(value) -> str:
    return "-" if value is None else ("0" if value == 0 else f"{value:.2g}")


def print_validate(report: dict, file=None) -> None:
    # markup off: reasons quote backend errors such as "[gloo/.../pair.cc:553]", which are not rich tags
    # force_jupyter=False: in a notebook, rich would otherwise display the table instead of writing to `file`
    console = Console(file=file or sys.stdout, width=140, highlight=False, soft_wrap=False, markup=False,
                      force_jupyter=False,
                      emoji=False)
    rows = report["results"]
    console.print(f"distdoctor validate: {report['world_size']} ranks, backend {report['backend']}"
                  f"{', iface ' + report['iface'] if report.get('iface') else ''}"
                  f"{', injected ' + ', '.join(report['injected']) if report.get('injected') else ''}")
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col, justify in (("op", "left"), ("group", "left"), ("pass", "right"), ("fail", "right"),
                         ("skip", "right"), ("max|err|", "right"), ("agree", "left"), ("note", "left")):
        table.add_column(col, justify=justify, no_wrap=True, overflow="ellipsis",
                         max_width=72 if col == "note" else None, min_width=len(col))
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["op"], r["group"]), []).append(r)
    for (op, group), rs in groups.items():
        errs = [r["max_abs_err"] for r in rs if r["max_abs_err"] is not None]
        agree = [r["ranks_agree"] for r in rs if r["ranks_agree"] is not None]
        fails = [r for r in rs if r["status"] == "fail"]
        skips = [r for r in rs if r["status"] == "skipped"]
        note = ""
        if fails:
            note = fails[0]["reason"]
        elif skips:
            kinds = sorted({_skip_what(r) for r in skips})
            note = f"skipped {', '.join(kinds)}: {skips[0]['reason']}"
        table.add_row(op, group, str(len(rs) - len(fails) - len(skips)), str(len(fails)) if fails else "",
                      str(len(skips)) if skips else "", _fmt_err(max(errs) if errs else None),
                      "-" if not agree else ("yes" if all(agree) else "NO"), note[:80])
    console.print(table)
    failures = [r for r in rows if r["status"] == "fail" and r.get("max_abs_err") is not None or
                r["status"] == "fail" and r.get("culprit_ranks")]
    if failures:
        console.print(f"\nFailures ({len(failures)}; first {min(len(failures), MAX_FAILURES_SHOWN)}):")
        for r in failures[:MAX_FAILURES_SHOWN]:
            console.print(f"  {r['op']} {_variant(r)} {r['dtype']} count={r['count']} on {r['group']}: {r['reason']}",
                          soft_wrap=True)
    for s in report.get("stragglers", []):
        console.print(f"Straggler: rank {s['rank']} arrives {s['median_late_s'] * 1e3:.0f} ms late at the median "
                      f"collective (late at {s['share_late']:.0%} of {s['collectives']}; threshold "
                      f"{report['straggler_threshold_s'] * 1e3:.0f} ms)", soft_wrap=True)
    for lost in report.get("lost", []):
        console.print(f"Lost: rank {lost['rank']} on {lost['host']}: {lost['reason']}"
                      + (f", in {lost['in_op']}" if lost.get("in_op") else ""), soft_wrap=True)
    console.print(verdict_line(report), style="bold green" if report["passed"] else "bold red", soft_wrap=True)


def _variant(r: dict) -> str:
    parts = [p for p in (r.get("form"), r.get("redop")) if p]
    if r.get("root") is not None:
        parts.append(f"root={r['root']}")
    parts.append("in-place" if r["inplace"] else "out-of-place")
    return " ".join(parts)


def _skip_what(r: dict) -> str:
    return " ".join(p for p in (r.get("redop"), r.get("dtype")) if p) or r["op"]
