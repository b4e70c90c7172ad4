"""One self-contained HTML page for the cluster check (`check`, `validate`, `bench` with `--html FILE`).

What a person looks at first: the verdict; the failed checks and lost ranks; bus bandwidth against size (and
against the baseline when one was given); the `--links` host-pair matrix as a heat map (the slow host is a dark
row and column); per-rank timing (bench: each rank's time relative to the median rank; validate: each rank's
median lateness at the pre-call barrier). Inline SVG and CSS only: no script, no external asset, so it opens
anywhere (an air-gapped cluster included). Every string that comes from a report (host names, error messages,
paths) goes through html.escape.
"""

from __future__ import annotations

import html
import math

from distdoctor.errors import InputError

W, H = 720, 300  # plot size
PAD_L, PAD_B, PAD_T, PAD_R = 64, 40, 16, 150
SERIES = {"in_place": "#1f77b4", "out_of_place": "#ff7f0e"}
CSS = ("body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}h1{font-size:20px}"
       "h2{font-size:16px;margin-top:28px}.pass{color:#1b7f3a}.fail{color:#b3261e}"
       ".verdict{font-size:17px;font-weight:600;padding:10px 14px;border-radius:6px;background:#f4f6f8}"
       "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:left}"
       "th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#666}"
       "svg text{font-family:system-ui,sans-serif}")


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def _size(n: float) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def render_cluster_html(check: dict | None = None, validate: dict | None = None, bench: dict | None = None,
                        title: str | None = None) -> str:
    """The page for a check report (its env/validate/bench parts), or a validate and/or a bench report."""
    if check is not None:
        validate, bench = check.get("validate"), check.get("bench")
    kind = "check" if check is not None else ("validate" if validate is not None else "bench")
    passed = (check or validate or bench)["passed"]
    verdict = _verdict(check, validate, bench)
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{esc(title or f'distdoctor {kind}')}</title><style>{CSS}</style></head><body>",
        f"<h1>distdoctor {esc(kind)}</h1>",
        f"<p class='verdict {'pass' if passed else 'fail'}'>{esc(verdict)}</p>",
        _where(check, validate, bench),
    ]
    parts.append(_failures(validate, bench, (check or {}).get("lost")))
    if bench is not None:
        parts.append("<h2>Bus bandwidth vs size</h2>")
        parts.append(_bandwidth_plot(bench))
        parts.append(_bandwidth_table(bench))
        if bench.get("links"):
            parts.append("<h2>Links between hosts</h2>")
            parts.append(_links_heatmap(bench))
    parts.append(_per_rank(validate, bench))
    if validate is not None:
        parts.append(_validate_summary(validate))
    parts.append("<p class='muted'>Written by distdoctor. Self-contained: no script, no external asset.</p>")
    parts.append("</body></html>")
    return "\n".join(p for p in parts if p)


def write_cluster_html(path: str, **reports) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(render_cluster_html(**reports))
    except OSError as exc:
        raise InputError(f"--html {path}", f"cannot write ({exc.strerror})") from None


# ---------------------------------------------------------------------------------------------- text parts
def _verdict(check, validate, bench) -> str:
    if check is not None:
        return check["verdict"]
    if validate is not None:
        from distdoctor.report.validate_text import verdict_line

        return verdict_line(validate)
    if bench["passed"]:
        return f"PASS: {bench['op']} {bench['dtype']}, average bus bandwidth {bench['avg_busbw_gbps']:.3g} GB/s"
    more = len(bench["failures"]) - 1
    return "FAIL: " + bench["failures"][0] + (f" (and {more} more: see the failed checks)" if more > 0 else "")


def _where(check, validate, bench) -> str:
    rep = check or validate or bench
    bits = [f"{rep['world_size']} ranks", f"backend {rep['backend']}"]
    if rep.get("device"):
        bits.append(f"on {rep['device']}")
    if rep.get("iface"):
        bits.append(f"iface {rep['iface']}")
    if check is not None:
        env = check["env"]
        bits.append(f"torch {env['torch_version']}")
        bits.append(f"launcher {env.get('launcher_kind', env.get('launcher'))}")
        bits.append(f"took {check['wall_s']:.1f} s")
    return f"<p>{esc(', '.join(bits))}</p>"


def _failures(validate, bench, lost) -> str:
    rows = []
    lost = lost if lost is not None else (validate or bench or {}).get("lost", [])
    for lr in lost:
        rows.append(("lost rank", f"rank {lr['rank']} on {lr['host']}", lr["reason"] + (
            f", in {lr['in_op']}" if lr.get("in_op") else "")))
    if validate is not None:
        for c in validate.get("culprits", []):
            rows.append(("culprit", f"rank {c['rank']}", "; ".join(c["why"][:3])))
        for r in [r for r in validate["results"] if r["status"] == "fail"][:50]:
            what = f"{r['op']} {r.get('redop') or ''} {r['dtype'] or ''} count={r['count']} on {r['group']}"
            rows.append(("failed check", " ".join(what.split()), r["reason"]))
    if bench is not None:
        for why in bench.get("failures", []):
            if not why.startswith("lost"):
                rows.append(("bench", bench["op"], why))
    if not rows:
        return "<h2>Failed checks</h2><p class='pass'>None.</p>"
    body = "".join(f"<tr><td>{esc(a)}</td><td>{esc(b)}</td><td>{esc(c)}</td></tr>" for a, b, c in rows)
    return f"<h2>Failed checks</h2><table><tr><th>kind</th><th>where</th><th>why</th></tr>{body}</table>"


def _validate_summary(validate: dict) -> str:
    groups: dict[tuple, list[dict]] = {}
    for r in validate["results"]:
        groups.setdefault((r["op"], r["group"]), []).append(r)
    body = []
    for (op, group), rs in groups.items():
        n = {s: sum(r["status"] == s for r in rs) for s in ("pass", "fail", "skipped")}
        errs = [r["max_abs_err"] for r in rs if r["max_abs_err"] is not None]
        cls = " class='fail'" if n["fail"] else ""
        body.append(f"<tr{cls}><td>{esc(op)}</td><td>{esc(group)}</td><td class='num'>{n['pass']}</td>"
                    f"<td class='num'>{n['fail']}</td><td class='num'>{n['skipped']}</td>"
                    f"<td class='num'>{esc(f'{max(errs):.2g}' if errs else '-')}</td></tr>")
    return ("<h2>Collective checks</h2><table><tr><th>op</th><th>group</th><th>pass</th><th>fail</th><th>skip</th>"
            f"<th>max |err|</th></tr>{''.join(body)}</table>")


def _bandwidth_table(bench: dict) -> str:
    base = {(r["size_bytes"], r["placement"]): r for r in (bench.get("baseline") or {}).get("rows", [])}
    body = []
    for r in bench["rows"]:
        place = "in_place" if r["inplace"] else "out_of_place"
        b = base.get((r["size_bytes"], place))
        ratio = f"{b['ratio']:.2f}" if b else "-"
        ref = f"{b['baseline_busbw_gbps']:.4g}" if b else "-"
        cls = " class='fail'" if b and not b["ok"] else ""
        body.append(f"<tr{cls}><td class='num'>{r['size_bytes']}</td><td>{esc(place.replace('_', '-'))}</td>"
                    f"<td class='num'>{r['time_us']:.1f}</td><td class='num'>{r['busbw_gbps']:.4g}</td>"
                    f"<td class='num'>{ref}</td>"
                    f"<td class='num'>{ratio}</td><td class='num'>{esc(r['wrong'] if r['wrong'] is not None else '-')}"
                    f"</td><td class='num'>{r['slowest_rank']}</td></tr>")
    return ("<table><tr><th>size (B)</th><th>placement</th><th>time (us)</th><th>busbw (GB/s)</th>"
            "<th>baseline</th><th>ratio</th><th>#wrong</th><th>slowest rank</th></tr>" + "".join(body) + "</table>")


# ---------------------------------------------------------------------------------------------- plots
def _bandwidth_plot(bench: dict) -> str:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in bench["rows"]:
        series.setdefault("in_place" if r["inplace"] else "out_of_place", []).append((r["size_bytes"],
                                                                                      r["busbw_gbps"]))
    base = bench.get("baseline")
    if base:
        for r in base["rows"]:
            series.setdefault(f"baseline {r['baseline_placement']}", []).append((r["size_bytes"],
                                                                                r["baseline_busbw_gbps"]))
    points = [p for pts in series.values() for p in pts if p[0] > 0]
    if not points:
        return "<p>No bandwidth row was measured.</p>"
    xs = [math.log2(p[0]) for p in points]
    x0, x1 = min(xs), max(xs)
    if x1 == x0:  # one size: put it in the middle
        x0, x1 = x0 - 1, x1 + 1
    pw, ph = W - PAD_L - PAD_R, H - PAD_T - PAD_B
    positive = [p[1] for p in points if p[1] > 0]
    # Bandwidth grows by orders of magnitude from small to large messages: a log axis shows every size.
    log_y = bool(positive) and max(positive) / min(positive) > 100
    if log_y:
        lo, hi = math.floor(math.log10(min(positive))), math.ceil(math.log10(max(positive)))
        hi = hi if hi > lo else lo + 1
        ticks = [10.0 ** e for e in range(lo, hi + 1)]
    else:
        y1 = max(p[1] for p in points) * 1.1 or 1.0
        ticks = [y1 * i / 4 for i in range(5)]

    def px(size):
        return PAD_L + (math.log2(size) - x0) / (x1 - x0) * pw

    def py(v):
        if log_y:
            return PAD_T + ph - (math.log10(max(v, 10.0 ** lo)) - lo) / (hi - lo) * ph
        return PAD_T + ph - v / y1 * ph

    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{H}' role='img' "
           f"aria-label='bus bandwidth against message size'>",
           f"<rect x='{PAD_L}' y='{PAD_T}' width='{pw}' height='{ph}' fill='#fafafa' stroke='#ccc'/>"]
    for v in ticks:
        out.append(f"<line x1='{PAD_L}' x2='{PAD_L + pw}' y1='{py(v):.1f}' y2='{py(v):.1f}' stroke='#e4e4e4'/>"
                   f"<text x='{PAD_L - 6}' y='{py(v) + 4:.1f}' font-size='11' text-anchor='end'>{v:.3g}</text>")
    for size in sorted({p[0] for p in points}):
        out.append(f"<text x='{px(size):.1f}' y='{PAD_T + ph + 16}' font-size='11' text-anchor='middle'>"
                   f"{esc(_size(size))}</text>")
    out.append(f"<text x='{PAD_L + pw / 2}' y='{H - 6}' font-size='12' text-anchor='middle'>message size (bytes, "
               f"log scale)</text><text x='14' y='{PAD_T + ph / 2}' font-size='12' text-anchor='middle' "
               f"transform='rotate(-90 14 {PAD_T + ph / 2})'>busbw (GB/s{', log scale' if log_y else ''})</text>")
    for k, (name, pts) in enumerate(series.items()):
        color = SERIES.get(name, "#555" if "in_place" in name else "#999")
        dash = " stroke-dasharray='6 4'" if name.startswith("baseline") else ""
        pts = sorted(p for p in pts if p[0] > 0)
        path = " ".join(f"{'M' if i == 0 else 'L'}{px(s):.1f},{py(v):.1f}" for i, (s, v) in enumerate(pts))
        out.append(f"<path d='{path}' fill='none' stroke='{color}' stroke-width='2'{dash}/>")
        for s, v in pts:
            out.append(f"<circle cx='{px(s):.1f}' cy='{py(v):.1f}' r='3.5' fill='{color}'><title>"
                       f"{esc(f'{name}: {s} B, {v:.4g} GB/s')}</title></circle>")
        ly = PAD_T + 14 + 18 * k
        out.append(f"<line x1='{W - PAD_R + 12}' x2='{W - PAD_R + 36}' y1='{ly - 4}' y2='{ly - 4}' stroke='{color}' "
                   f"stroke-width='2'{dash}/><text x='{W - PAD_R + 42}' y='{ly}' font-size='12'>"
                   f"{esc(name.replace('_', '-'))}</text>")
    out.append("</svg>")
    return "".join(out)


def _links_heatmap(bench: dict) -> str:
    """Host x host, each cell the fastest transfer src -> dst (GB/s); darker is slower, so a slow host shows as a
    dark row and column. Slow hosts and links are outlined in red."""
    rows = [r for r in bench["links"] if r["src_host"] != r["dst_host"]]
    if not rows:
        note = bench.get("links_note") or "no inter-host link was measured"
        return f"<p>{esc(note)}</p>"
    hosts = sorted({h for r in rows for h in (r["src_host"], r["dst_host"])})
    cell = {(r["src_host"], r["dst_host"]): r for r in rows}
    top = max(r["best_gbps"] for r in rows) or 1.0
    slow_hosts = {s["host"] for s in bench.get("slow_hosts", [])}
    slow_links = {frozenset(s["hosts"]) for s in bench.get("slow_links", [])}
    size, left, head = 64, 150, 110
    width, height = left + size * len(hosts) + 20, head + size * len(hosts) + 10
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
           f"aria-label='link speed between every pair of hosts'>",
           f"<text x='{left}' y='14' font-size='12'>destination host &#8594;</text>",
           f"<text x='4' y='{head - 6}' font-size='12'>source host &#8595;</text>"]
    for j, h in enumerate(hosts):
        x = left + j * size + size / 2
        out.append(f"<text x='{x:.1f}' y='{head - 8}' font-size='11' text-anchor='start' "
                   f"transform='rotate(-40 {x:.1f} {head - 8})'>{esc(h)}</text>")
    for i, src in enumerate(hosts):
        y = head + i * size
        out.append(f"<text x='{left - 6}' y='{y + size / 2 + 4:.1f}' font-size='11' text-anchor='end'>{esc(src)}"
                   "</text>")
        for j, dst in enumerate(hosts):
            x = left + j * size
            r = cell.get((src, dst))
            if r is None:
                out.append(f"<rect x='{x}' y='{y}' width='{size - 2}' height='{size - 2}' fill='#eee'/>")
                continue
            frac = max(0.0, min(1.0, r["best_gbps"] / top))
            shade = int(40 + 200 * frac)  # slow: dark, fast: light
            fill = f"rgb({shade},{int(60 + 180 * frac)},{int(90 + 150 * frac)})"
            red = src in slow_hosts or dst in slow_hosts or frozenset((src, dst)) in slow_links
            stroke = " stroke='#d00' stroke-width='3'" if red else ""
            text_color = "#fff" if frac < 0.5 else "#111"
            tip = (f"{src} -> {dst}: {r['gbps']:.4g} GB/s median, {r['best_gbps']:.4g} best, "
                   f"{r['latency_us']:.0f} us latency, {r['iters']} transfers")
            out.append(f"<rect x='{x}' y='{y}' width='{size - 2}' height='{size - 2}' fill='{fill}'{stroke}>"
                       f"<title>{esc(tip)}</title></rect><text x='{x + size / 2 - 1:.1f}' y='{y + size / 2 + 4:.1f}' "
                       f"font-size='11' text-anchor='middle' fill='{text_color}'>{r['best_gbps']:.3g}</text>")
    out.append("</svg>")
    caption = (f"GB/s of the fastest transfer of {bench.get('link_bytes')} B from each source host (row) to each "
               "destination (column); darker is slower; a red outline marks a slow host or link.")
    verdict = [f"slow host {s['host']} ({s['ratio']:.2g}x the others)" if s.get("ratio") else f"slow host {s['host']}"
               for s in bench.get("slow_hosts", [])]
    verdict += [f"slow link {a} <-> {b} ({s['ratio']:.2g}x)" for s in bench.get("slow_links", [])
                for a, b in [s["hosts"]]]
    note = "; ".join(verdict) or bench.get("links_note") or f"no slow host or link among {len(hosts)} hosts"
    return f"<figure><figcaption>{esc(caption)}</figcaption>{''.join(out)}</figure><p>{esc(note)}</p>"


def _per_rank(validate, bench) -> str:
    """Bars per rank: bench time / median rank, validate median lateness (ms). The slowest bar is red."""
    charts = []
    if bench is not None and bench.get("per_rank_time_us"):
        values = {int(r): v for r, v in bench["per_rank_time_us"].items()}
        charts.append(_bars(values, "bench: each rank's time / the median rank's (1 = typical; red: over 1.25)",
                            "{:.2f}", 1.0, 1.25, bench.get("rank_hosts", {})))
    if validate is not None and validate.get("per_rank_late_s"):
        values = {int(r): v * 1e3 for r, v in validate["per_rank_late_s"].items()}
        threshold_ms = validate["straggler_threshold_s"] * 1e3
        charts.append(_bars(values, "validate: median lateness at the barrier before each call (ms); threshold "
                                    f"{validate['straggler_threshold_s'] * 1e3:g} ms",
                            "{:.3g}", threshold_ms, threshold_ms, {}))
    if not charts:
        return ""
    return "<h2>Per-rank timing</h2>" + "".join(charts)


def _bars(values: dict[int, float], caption: str, fmt: str, mark: float, red_above: float, hosts: dict) -> str:
    """One bar per rank, a dashed line at `mark`; bars above `red_above` are red."""
    ranks = sorted(values)
    largest = max(abs(v) for v in values.values())
    # Values far below the mark (a passing run's lateness: microseconds under a 100 ms threshold) are drawn on
    # their own scale, with the scale's top written on the axis, instead of as bars too flat to see.
    zoom = 0 < largest < mark / 10
    top = (largest if zoom else max(max(values.values()), mark)) * 1.15 or 1.0
    bar_w = max(6, min(40, 640 // max(len(ranks), 1)))
    width, height, base = 60 + bar_w * len(ranks) + 20, 200, 170
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' role='img' "
           f"aria-label='{esc(caption)}'>"]
    my, label = (base - largest / top * 150, largest) if zoom else (base - mark / top * 150, mark)
    out.append(f"<line x1='56' x2='{width - 10}' y1='{my:.1f}' y2='{my:.1f}' stroke='#999' "
               f"stroke-dasharray='{'1 3' if zoom else '4 3'}'/>"
               f"<text x='52' y='{my + 4:.1f}' font-size='10' text-anchor='end'>{esc(fmt.format(label))}</text>")
    if zoom:
        caption += f" (all far below {fmt.format(mark)}: drawn to the largest, {fmt.format(largest)})"
    for i, r in enumerate(ranks):
        h = values[r] / top * 150 or 0.0  # (never -0.0: SVG heights are >= 0)
        # A rank early at the barrier has a negative lateness: a short bar below the axis (SVG heights are >= 0).
        y, h = (base - h, h) if h >= 0 else (base, min(-h, 12.0))
        x = 60 + i * bar_w
        color = "#d62728" if values[r] > red_above else "#4c78a8"
        host = f" on {hosts.get(str(r))}" if hosts.get(str(r)) else ""
        out.append(f"<rect x='{x}' y='{y:.1f}' width='{bar_w - 2}' height='{h:.1f}' fill='{color}'><title>"
                   f"{esc(f'rank {r}{host}: ' + fmt.format(values[r]))}</title></rect>")
        if len(ranks) <= 32:
            out.append(f"<text x='{x + bar_w / 2 - 1:.1f}' y='{base + 14}' font-size='10' text-anchor='middle'>{r}"
                       "</text>")
    out.append(f"<text x='60' y='{height - 2}' font-size='11'>rank</text></svg>")
    return f"<figure><figcaption>{esc(caption)}</figcaption>{''.join(out)}</figure>"
