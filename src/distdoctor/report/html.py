"""One self-contained HTML report for `distdoctor diagnose`: verdict and findings, a timeline of collectives per
rank, and the wait-for graph, drawn as inline SVG. No external assets, no script. Every string that comes from
a dump (paths, op names, group names, frames) goes through html.escape."""

from __future__ import annotations

import html

from distdoctor.diagnose.analyze import Report
from distdoctor.report.diagnose_threads import thread_table_html
from distdoctor.report.diagnose_waits_html import group_label, ranks_table_html, waitfor_html
from distdoctor.report.findings import findings_html, who

ROW_H = 22
WIDTH = 1100
MAX_TIMELINE_RANKS = 64
MAX_TIMELINE_ENTRIES = 400  # the last N entries per rank: the hang is at the end
COLORS = {"completed": "#7fb77e", "started": "#f0b84d", "issued": "#e0584c"}


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def render_html(report: Report) -> str:
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>distdoctor diagnose</title>",
        "<style>body{font-family:sans-serif;margin:24px;color:#222}h1{font-size:20px}"
        ".problem{color:#b3261e}.ok{color:#2e7d32}.f{margin:10px 0;padding:8px 12px;border-left:4px solid #b3261e;"
        "background:#fbf1f0}.k{font-weight:bold}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}code{font-size:12px}</style></head><body>",
        f"<h1>distdoctor diagnose: <span class='{esc(report.verdict)}'>{esc(report.verdict.upper())}</span></h1>",
        f"<p>world size {esc(report.world_size)}, {len(report.traces.ranks)} traces loaded, "
        f"{len(report.traces.errors)} unusable.</p>",
    ]
    parts.append(findings_html(report.findings, lambda g: group_label(report, g)))  # the one findings renderer
    if report.consequences and report.findings:
        parts.append("<h2>Consequences</h2><p>Waits and divergences the findings above explain (finding number in "
                     "brackets).</p><ul>")
        parts.extend(f"<li>{esc(c['kind'])}: {esc(who(c['ranks']))} at {esc(c['op'])} #{esc(c['seq'])} on "
                     f"{esc(group_label(report, c['group']))}: {esc(c['because'])} [{esc(c['finding'] + 1)}]</li>"
                     for c in report.consequences[:200])
        parts.append("</ul>")
    parts.append("<h2>Timeline of collectives per rank</h2>")
    parts.append("<p>Ranks whose last calls agree share a row (the first "
                 f"{MAX_TIMELINE_RANKS} such rows are drawn).</p>")
    parts.append("<p>Green: completed; orange: started; red: issued and not completed (where the rank waits). "
                 "Hover a box for the collective.</p>")
    parts.append(_timeline(report))
    parts.append("<h2>Wait-for graph</h2><p>An arrow A &rarr; B, labelled with the collective: the ranks A are "
                 "blocked in it and the ranks B have not reached it. Ranks that wait in the same collective for the "
                 "same ranks are one box. Red arrows lie on a deadlock cycle; dashed boxes are ranks without a "
                 "trace.</p>")
    parts.append(waitfor_html(report))
    parts.append("<h2>Ranks</h2><p>Ranks in the same state at the same place share a row.</p>")
    parts.append(ranks_table_html(report))
    parts.append(thread_table_html(report))  # ranks read from per-rank logs
    if report.traces.errors:
        parts.append("<h2>Files not used</h2><ul>")
        parts.extend(f"<li><code>{esc(e.path)}</code>: {esc(e.reason)}</li>" for e in report.traces.errors)
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _timeline(report: Report) -> str:
    """One row per set of ranks whose last entries agree (op, seq, group, state): 1024 ranks in lockstep are one
    row, and the rank that differs stands out."""
    rows: dict[tuple, list[int]] = {}
    for rank, trace in report.traces.ranks.items():
        entries = trace.entries[-MAX_TIMELINE_ENTRIES:]
        key = tuple((e.op, e.seq if not e.is_p2p else e.p2p_seq, e.group, e.state) for e in entries)
        rows.setdefault(key, []).append(rank)
    if not rows:
        return "<p>No traces.</p>"
    shown = sorted(rows.items(), key=lambda kv: min(kv[1]))[:MAX_TIMELINE_RANKS]
    max_len = max(min(len(report.traces.ranks[ranks[0]].entries), MAX_TIMELINE_ENTRIES) for _, ranks in shown) or 1
    left = 190
    box = max(2.0, (WIDTH - left - 10) / max_len)
    height = ROW_H * len(shown) + 20
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}'>"]
    for row, (_, ranks) in enumerate(shown):
        y = 10 + row * ROW_H
        label = who(ranks)
        short = label if len(label) <= 28 else label[:27] + "…"
        out.append(f"<text x='4' y='{y + 14}' font-size='12'>{esc(short)}<title>{esc(label)}</title></text>")
        entries = report.traces.ranks[ranks[0]].entries[-MAX_TIMELINE_ENTRIES:]
        for i, e in enumerate(entries):
            x = left + i * box
            color = COLORS.get(e.state, "#999")
            seq = e.seq if not e.is_p2p else e.p2p_seq
            tip = f"{e.op} #{seq} on {group_label(report, e.group)} {e.state} sizes {e.in_sizes} {e.in_dtypes}"
            out.append(f"<rect x='{x:.1f}' y='{y}' width='{max(box - 1, 1):.1f}' height='{ROW_H - 4}' fill='{color}'>"
                       f"<title>{esc(tip)}</title></rect>")
    out.append("</svg>")
    return "".join(out)
