"""The diagnose page's wait-for graph and rank table, readable from 2 ranks to thousands.

Ranks that say the same thing are one node or one row, named by ranges (`ranks 0-4, 6-1023`): a waiting node
is every rank blocked in the same collective (op, seq, group) for the same ranks; a node of ranks that are
waited for but wait for nothing themselves joins the ranks in the same state waited for by the same nodes.
Every edge is labelled with the collective it waits in, `all_reduce #12 on group '3' (mesh_dp)`: groups by the
name the user gave them (DeviceMesh dimension, `group_desc`) as the text report names them. Strings from dumps
go through html.escape.
"""

from __future__ import annotations

import html
import math

from distdoctor.diagnose.analyze import Report
from distdoctor.findings.kinds import fmt_group
from distdoctor.report.findings import who

MAX_NODES = 24  # beyond this the picture is left out and the edge table says it all
MAX_ROWS = 300
BOX_W, BOX_H, GAP = 330, 34, 22


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def group_label(report: Report, name: str | None) -> str:
    view = report.views.get(name) if name is not None else None
    return fmt_group(name, view.desc if view is not None else None)


def wait_label(report: Report, entry) -> str:
    seq = entry.p2p_seq if entry.is_p2p else entry.seq
    peer = f" {'to' if entry.op == 'send' else 'from'} rank {entry.peer}" if entry.is_p2p else ""
    return f"{entry.op}{peer} #{seq} on {group_label(report, entry.group)}"


def _state(report: Report, rank: int) -> str:
    p = report.ranks.get(str(rank), {})
    return "no trace" if p.get("missing") or rank not in report.traces.ranks else str(p.get("state") or "?")


def collapse(report: Report) -> tuple[list[dict], list[dict]]:
    """(nodes, edges). A node: {"ranks", "waiting": label or None, "state"}; an edge: {"src", "dst" (node
    indexes), "label", "cycle"}."""
    classes: dict[tuple, list[int]] = {}
    label_of: dict[tuple, str] = {}
    for w in report.waits:
        e = w.entry
        key = (e.group, e.op, e.seq, e.p2p_seq, e.peer, tuple(sorted(set(w.waits_for))))
        if key not in classes:
            classes[key], label_of[key] = [], wait_label(report, e)
        classes[key].append(w.rank)
    keys = sorted(classes, key=lambda k: min(classes[k]))
    nodes = [{"ranks": sorted(set(classes[k])), "waiting": label_of[k], "state": "waiting"} for k in keys]
    node_of = {}
    for i, n in enumerate(nodes):
        for r in n["ranks"]:
            node_of.setdefault(r, i)  # a rank blocked on two streams: its first wait places it
    leaves: dict[tuple, list[int]] = {}
    for i, k in enumerate(keys):
        for r in k[-1]:
            if r not in node_of:
                leaves.setdefault(r, []).append(i)
    by_leaf: dict[tuple, list[int]] = {}
    for r, waiters in leaves.items():
        by_leaf.setdefault((_state(report, r), tuple(sorted(set(waiters)))), []).append(r)
    for (state, _), ranks in sorted(by_leaf.items(), key=lambda kv: min(kv[1])):
        for r in ranks:
            node_of[r] = len(nodes)
        nodes.append({"ranks": sorted(ranks), "waiting": None, "state": state})
    cycle_pairs = {(a, b) for c in report.cycles for a, b, _ in c.steps}
    edges: dict[tuple[int, int], dict] = {}
    for i, k in enumerate(keys):
        for r in k[-1]:
            j = node_of[r]
            edge = edges.setdefault((i, j), {"src": i, "dst": j, "label": label_of[k], "cycle": False})
            if any((a, r) in cycle_pairs for a in classes[k]):
                edge["cycle"] = True
    return nodes, list(edges.values())


def waitfor_html(report: Report) -> str:
    nodes, edges = collapse(report)
    if not nodes:
        return "<p>No rank waits for another.</p>"
    out = []
    if len(nodes) <= MAX_NODES:
        out.append(_picture(nodes, edges))
    else:
        out.append(f"<p>{len(nodes)} distinct nodes: too many to draw; every edge is in the table below.</p>")
    out.append("<table class='wf'><tr><th>ranks</th><th>wait in</th><th>for</th></tr>")
    for e in edges[:MAX_ROWS]:
        src, dst = nodes[e["src"]], nodes[e["dst"]]
        mark = " style='color:#b3261e;font-weight:bold'" if e["cycle"] else ""
        out.append(f"<tr{mark}><td>{esc(who(src['ranks']))}</td><td>{esc(e['label'])}</td>"
                   f"<td>{esc(who(dst['ranks']))} ({esc(dst['waiting'] and 'waiting' or dst['state'])})</td></tr>")
    out.append("</table>" + _more(len(edges), "edges", "wait_for"))
    return "\n".join(out)


def _picture(nodes: list[dict], edges: list[dict]) -> str:
    """Waiting ranks in the left column, ranks they wait for that wait for nothing in the right one; an edge
    between two waiting nodes bends out to the right of the left column."""
    left = [i for i, n in enumerate(nodes) if n["waiting"]]
    right = [i for i, n in enumerate(nodes) if not n["waiting"]]
    xs = {0: 10, 1: 10 + BOX_W + 400}
    pos = {}
    for col, members in ((0, left), (1, right)):
        for row, i in enumerate(members):
            pos[i] = (xs[col], 10 + row * (BOX_H + GAP))
    height = 20 + max(len(left), len(right)) * (BOX_H + GAP)
    width = xs[1] + BOX_W + 10
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-size='12'>",
           "<defs><marker id='wa' markerWidth='10' markerHeight='7' refX='10' refY='3.5' orient='auto'>"
           "<polygon points='0 0, 10 3.5, 0 7' fill='#555'/></marker>"
           "<marker id='war' markerWidth='10' markerHeight='7' refX='10' refY='3.5' orient='auto'>"
           "<polygon points='0 0, 10 3.5, 0 7' fill='#d32f2f'/></marker></defs>"]
    for k, e in enumerate(edges):
        (x1, y1), (x2, y2) = pos[e["src"]], pos[e["dst"]]
        color, marker, wide = ("#d32f2f", "war", 2.5) if e["cycle"] else ("#555", "wa", 1.2)
        title = f"<title>{esc(e['label'])}</title>"
        if nodes[e["dst"]]["waiting"]:  # both in the left column: a bend to the right
            sx, sy, ex, ey = x1 + BOX_W, y1 + BOX_H * 0.35, x2 + BOX_W, y2 + BOX_H * 0.65
            bend = 50 + 30 * (k % 4) + abs(ey - sy) * 0.15
            path = f"M{sx:.0f},{sy:.0f} C{sx + bend:.0f},{sy:.0f} {ex + bend:.0f},{ey:.0f} {ex:.0f},{ey:.0f}"
            # the label beside the source's end of the bend: two opposite edges never share a spot
            lx, ly = sx + bend * 0.8 + 6, (sy + 14 if ey > sy else sy - 4)  # past the bend, off straight edges
            anchor = "start"
        else:
            sx, sy, ex, ey = x1 + BOX_W, y1 + BOX_H / 2, x2, y2 + BOX_H / 2
            path = f"M{sx:.0f},{sy:.0f} L{ex:.0f},{ey:.0f}"
            t = 0.62  # past the bends that leave the left column
            lx, ly = sx + (ex - sx) * t, sy + (ey - sy) * t - 4
            anchor = "middle"
        angle = 0.0 if anchor == "start" else math.degrees(math.atan2(ey - sy, ex - sx))
        out.append(f"<path d='{path}' fill='none' stroke='{color}' stroke-width='{wide}' "
                   f"marker-end='url(#{marker})'>{title}</path>")
        out.append(f"<text x='{lx:.0f}' y='{ly:.0f}' text-anchor='{anchor}' fill='{color}' "
                   f"transform='rotate({angle:.1f} {lx:.0f} {ly:.0f})'>{esc(e['label'])}</text>")
    for i, n in enumerate(nodes):
        x, y = pos[i]
        dash = " stroke-dasharray='4 3'" if n["state"] == "no trace" else ""
        fill = "#fdecea" if any(e["cycle"] and i in (e["src"], e["dst"]) for e in edges) else "#fff"
        out.append(f"<rect x='{x}' y='{y}' width='{BOX_W}' height='{BOX_H}' rx='6' fill='{fill}' "
                   f"stroke='#333'{dash}/>")
        out.append(f"<text x='{x + 8}' y='{y + 14}' font-weight='bold'>{esc(_short(who(n['ranks'])))}</text>")
        out.append(f"<text x='{x + 8}' y='{y + 28}'>{esc(_short(n['waiting'] or n['state'], 50))}</text>")
    out.append("</svg>")
    return "".join(out)


def _short(text: str, limit: int = 46) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def ranks_table_html(report: Report) -> str:
    """One row per set of ranks that say the same thing (state, calls completed, where blocked, now)."""
    rows: dict[tuple, list[int]] = {}
    for rank, p in report.ranks.items():
        if p.get("missing"):
            key = ("no_trace", "", "no trace", "", "")
        else:
            pend = p["pending"][0] if p["pending"] else None
            where = "-"
            if pend:
                where = (f"{pend['op']} #{pend['seq']} on {group_label(report, pend['group'])} "
                         f"{pend.get('called_from', '')}").rstrip()
            key = (str(p.get("state", "")), str(p.get("state_detail", "")), str(sum(p["completed"].values())),
                   where, str(p.get("now", "")))
        rows.setdefault(key, []).append(int(rank))
    out = ["<table><tr><th>ranks</th><th>state</th><th>completed</th><th>blocked in</th><th>now</th></tr>"]
    ordered = sorted(rows.items(), key=lambda kv: min(kv[1]))
    for (state, detail, completed, where, now), ranks in ordered[:MAX_ROWS]:
        if state == "no_trace":
            out.append(f"<tr><td>{esc(who(ranks))}</td><td>no_trace</td><td colspan=3>no trace</td></tr>")
            continue
        out.append(f"<tr><td>{esc(who(ranks))}</td><td title='{esc(detail)}'>{esc(state)}</td>"
                   f"<td>{esc(completed)}</td><td>{esc(where)}</td><td><code>{esc(now)}</code></td></tr>")
    out.append("</table>" + _more(len(ordered), "rows", "ranks"))
    return "\n".join(out)


def _more(count: int, what: str, field: str) -> str:
    return f"<p>... and {count - MAX_ROWS} more {what} (--format json: {field}).</p>" if count > MAX_ROWS else ""
