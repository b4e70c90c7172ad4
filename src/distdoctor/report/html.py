"""One self-contained HTML report for `distdoctor diagnose`: verdict and findings, a timeline of collectives per
rank, and the wait-for graph, drawn as inline SVG. No external assets, no script. Every string that comes from
a dump (paths, op names, group names, frames) goes through html.escape."""

from __future__ import annotations

import html
import math

from distdoctor.diagnose.analyze import Report
from distdoctor.report.diagnose_threads import thread_table_html

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
    for f in report.findings:
        parts.append(f"<div class='f'><span class='k'>{esc(f.kind)}</span> ranks {esc(f.ranks)} group "
                     f"{esc(f.group)} seq {esc(f.seq)} op {esc(f.op)}<br>{esc(f.detail)}</div>")
    if report.consequences and report.findings:
        parts.append("<h2>Consequences</h2><p>Waits and divergences the findings above explain (finding number in "
                     "brackets).</p><ul>")
        parts.extend(f"<li>{esc(c['kind'])}: ranks {esc(c['ranks'])} at {esc(c['op'])} #{esc(c['seq'])} group "
                     f"{esc(c['group'])}: {esc(c['because'])} [{esc(c['finding'] + 1)}]</li>"
                     for c in report.consequences[:200])
        parts.append("</ul>")
    parts.append("<h2>Timeline of collectives per rank</h2>")
    parts.append("<p>Green: completed; orange: started; red: issued and not completed (where the rank waits). "
                 "Hover a box for the collective.</p>")
    parts.append(_timeline(report))
    parts.append("<h2>Wait-for graph</h2><p>An arrow A &rarr; B: rank A is blocked in a collective that B has not "
                 "reached. Red arrows lie on a deadlock cycle; dashed circles are ranks without a trace.</p>")
    parts.append(_waitfor(report))
    parts.append("<h2>Ranks</h2><table><tr><th>rank</th><th>state</th><th>completed</th><th>blocked in</th>"
                 "<th>now</th></tr>")
    for rank, p in report.ranks.items():
        if p.get("missing"):
            parts.append(f"<tr><td>{esc(rank)}</td><td>no_trace</td><td colspan=3>no trace</td></tr>")
            continue
        pend = p["pending"][0] if p["pending"] else None
        where = (f"{pend['op']} #{pend['seq']} on '{pend['group']}' {pend.get('called_from', '')}" if pend else "-")
        parts.append(f"<tr><td>{esc(rank)}</td><td title='{esc(p.get('state_detail', ''))}'>{esc(p.get('state', ''))}"
                     f"</td><td>{esc(sum(p['completed'].values()))}</td><td>{esc(where)}</td>"
                     f"<td><code>{esc(p.get('now', ''))}</code></td></tr>")
    parts.append("</table>")
    parts.append(thread_table_html(report))  # ranks read from per-rank logs
    if report.traces.errors:
        parts.append("<h2>Files not used</h2><ul>")
        parts.extend(f"<li><code>{esc(e.path)}</code>: {esc(e.reason)}</li>" for e in report.traces.errors)
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _timeline(report: Report) -> str:
    ranks = list(report.traces.ranks.items())[:MAX_TIMELINE_RANKS]
    if not ranks:
        return "<p>No traces.</p>"
    max_len = max(min(len(t.entries), MAX_TIMELINE_ENTRIES) for _, t in ranks) or 1
    left = 70
    box = max(2.0, (WIDTH - left - 10) / max_len)
    height = ROW_H * len(ranks) + 20
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}'>"]
    for row, (rank, trace) in enumerate(ranks):
        y = 10 + row * ROW_H
        out.append(f"<text x='4' y='{y + 14}' font-size='12'>rank {esc(rank)}</text>")
        entries = trace.entries[-MAX_TIMELINE_ENTRIES:]
        for i, e in enumerate(entries):
            x = left + i * box
            color = COLORS.get(e.state, "#999")
            seq = e.seq if not e.is_p2p else e.p2p_seq
            out.append(f"<rect x='{x:.1f}' y='{y}' width='{max(box - 1, 1):.1f}' height='{ROW_H - 4}' fill='{color}'>"
                       f"<title>{esc(f'{e.op} #{seq} group {e.group} {e.state} sizes {e.in_sizes} {e.in_dtypes}')}"
                       f"</title></rect>")
    out.append("</svg>")
    return "".join(out)


def _waitfor(report: Report) -> str:
    nodes = sorted(set(report.traces.ranks) | {r for w in report.waits for r in w.waits_for}
                   | set(range(report.world_size or 0)))
    if len(nodes) > 128:
        nodes = sorted({w.rank for w in report.waits} | {r for w in report.waits for r in w.waits_for})
    if not nodes:
        return "<p>No ranks.</p>"
    size = 520
    cx = cy = size / 2
    radius = size / 2 - 50
    pos = {r: (cx + radius * math.cos(2 * math.pi * i / len(nodes) - math.pi / 2),
               cy + radius * math.sin(2 * math.pi * i / len(nodes) - math.pi / 2)) for i, r in enumerate(nodes)}
    cycle_edges = {(a, b) for c in report.cycles for a, b, _ in c.steps}
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{size}' height='{size}'>",
           "<defs><marker id='a' markerWidth='10' markerHeight='7' refX='10' refY='3.5' orient='auto'>"
           "<polygon points='0 0, 10 3.5, 0 7' fill='#555'/></marker>"
           "<marker id='ar' markerWidth='10' markerHeight='7' refX='10' refY='3.5' orient='auto'>"
           "<polygon points='0 0, 10 3.5, 0 7' fill='#d32f2f'/></marker></defs>"]
    seen = set()
    for w in report.waits:
        for b in w.waits_for:
            if (w.rank, b) in seen or w.rank not in pos or b not in pos:
                continue
            seen.add((w.rank, b))
            (x1, y1), (x2, y2) = pos[w.rank], pos[b]
            dx, dy = x2 - x1, y2 - y1
            d = math.hypot(dx, dy) or 1
            x1, y1, x2, y2 = x1 + dx / d * 18, y1 + dy / d * 18, x2 - dx / d * 18, y2 - dy / d * 18
            red = (w.rank, b) in cycle_edges
            label = f"rank {w.rank} waits for rank {b} in {w.entry.op} #{w.entry.seq} on group {w.entry.group}"
            out.append(f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' "
                       f"stroke='{'#d32f2f' if red else '#555'}' stroke-width='{2.5 if red else 1.2}' "
                       f"marker-end='url(#{'ar' if red else 'a'})'><title>{esc(label)}</title></line>")
    for r, (x, y) in pos.items():
        dash = " stroke-dasharray='4 3'" if r not in report.traces.ranks else ""
        out.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='16' fill='#fff' stroke='#333'{dash}/>"
                   f"<text x='{x:.1f}' y='{y + 4:.1f}' font-size='12' text-anchor='middle'>{esc(r)}</text>")
    out.append("</svg>")
    return "".join(out)
