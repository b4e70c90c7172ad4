"""The per-rank-log section of the `diagnose` report (text and HTML): where each thread stands (the threads the
findings name first, then those of the ranks furthest behind), the last NCCL call each rank logged per communicator
(with its file:line), and one line saying how many log lines each rank skipped as unreadable."""

from __future__ import annotations

import html

from distdoctor.diagnose.threads import ordered_threads

MAX_THREAD_LINES = 48
MAX_RANK_LINES = 32


def thread_lines(report) -> list[str]:
    """Text lines (with a leading blank line), or none when no rank was read from a log."""
    logs = {r: p["log"] for r, p in report.ranks.items() if "log" in p}
    if not logs:
        return []
    lines = [""]
    rows = ordered_threads(report.ranks, report.findings)
    if rows:
        lines.append("where each thread is (per-rank logs; the stuck and the furthest behind first):")
    for i, (rank, thread, st) in enumerate(rows):
        if i == MAX_THREAD_LINES:
            lines.append(f"  ... {len(rows) - MAX_THREAD_LINES} more threads (see --format json, ranks.<r>.threads)")
            break
        lines.append(f"  rank {rank} thread {thread}: {_state(st)}")
    nccl = {r: log["nccl"] for r, log in logs.items() if log.get("nccl")}
    if nccl:
        lines.append("last NCCL call per communicator (per-rank logs):")
        named = {str(r) for f in report.findings for r in f.ranks}
        order = sorted(nccl, key=lambda r: (r not in named, int(r)))
        for i, rank in enumerate(order):
            if i == MAX_RANK_LINES:
                lines.append(f"  ... {len(order) - MAX_RANK_LINES} more ranks (see --format json, ranks.<r>.log.nccl)")
                break
            lines.append(f"  rank {rank}: " + "; ".join(f"'{comm}' {c['call']} opCount {c['opCount']} ({c['line']})"
                                                    for comm, c in sorted(nccl[rank].items())))
    lines.append(skipped_line(logs))
    return lines


def _state(st: dict) -> str:
    if st["open_op"]:
        s = f"inside {st['open_op']} (run {st['run']}) since {st['line']}"
        if st.get("open_for_s") is not None:
            s += f", {st['open_for_s']:.1f} s before the log ends"
        s += f"; last finished {st['last_done']}" if st["last_done"] else "; nothing finished before"
    else:
        s = f"idle; last finished {st['last_done']} ({st['last_done_line']})" if st["last_done"] else "idle"
    extra = [f"{len(st['also_open'])} outer op(s) open" if st.get("also_open") else "",
             f"{st['unclosed']} begin(s) never ended" if st.get("unclosed") else "",
             f"{st['unmatched_ends']} end(s) without a begin" if st.get("unmatched_ends") else ""]
    extra = [e for e in extra if e]
    return s + (f" ({', '.join(extra)})" if extra else "")


def skipped_line(logs: dict[str, dict]) -> str:
    """One line: how many lines each rank's log skipped as unreadable (ranks with none are counted, not listed)."""
    bad = {r: log for r, log in logs.items() if log["skipped_lines"]}
    if not bad:
        return f"log lines skipped as unreadable: none ({len(logs)} rank log{'s' if len(logs) != 1 else ''})"
    parts = [f"rank {r}: {log['skipped_lines']}" + (f" (first at {log['skipped_at'][0]})" if log["skipped_at"] else "")
             for r, log in list(bad.items())[:16]]
    if len(bad) > 16:
        parts.append(f"... {len(bad) - 16} more ranks")
    rest = len(logs) - len(bad)
    tail = f"; none on the other {rest} ranks" if rest else ""
    return "log lines skipped as unreadable: " + ", ".join(parts) + tail


def thread_table_html(report) -> str:
    """An HTML table of the same rows, or "" when no rank was read from a log."""
    logs = {r: p["log"] for r, p in report.ranks.items() if "log" in p}
    if not logs:
        return ""
    esc = lambda v: html.escape(str(v), quote=True)  # noqa: E731 - every string here comes from a log
    parts = ["<h2>Threads (per-rank logs)</h2><table><tr><th>rank</th><th>thread</th><th>inside (begun at)</th>"
             "<th>last finished</th></tr>"]
    for rank, thread, st in ordered_threads(report.ranks, report.findings)[:500]:
        inside = f"{st['open_op']} ({st['line']})" if st["open_op"] else "-"
        parts.append(f"<tr><td>{esc(rank)}</td><td>{esc(thread)}</td><td>{esc(inside)}</td>"
                     f"<td>{esc(st['last_done'] or '-')}</td></tr>")
    parts.append(f"</table><p>{esc(skipped_line(logs))}</p>")
    return "\n".join(parts)


__all__ = ["thread_lines", "thread_table_html", "skipped_line"]
