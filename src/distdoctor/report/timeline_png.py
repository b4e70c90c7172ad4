"""A timeline PNG: one row per (rank, stream), ops as bars, waits hatched, blocked ops marked in red.

Takes the shared Chrome-trace `Span`s (distdoctor.report.chrome_trace), so any producer of spans (the
simulator, the doctor) can draw one. Rendering uses matplotlib's Agg backend (no display needed). Rows are
capped (`max_rows`) so a 4096-rank plan still gives a readable picture; the title says how many were left
out, and rows with blocked spans are kept first.
"""

from __future__ import annotations

from pathlib import Path

from distdoctor.report.chrome_trace import Span

_COLORS = {"compute": "#4C78A8", "collective": "#F58518", "send": "#54A24B", "recv": "#54A24B"}


def write_timeline_png(spans: list[Span], path: str | Path, title: str = "timeline", max_rows: int = 48) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows: dict[tuple[int, str], list[Span]] = {}
    for s in spans:
        rows.setdefault((s.rank, s.track), []).append(s)
    keys = sorted(rows, key=lambda k: k[0])  # per rank, streams in order of first activity
    hidden = 0
    if len(keys) > max_rows:
        blocked = [k for k in keys if any(s.blocked for s in rows[k])]
        rest = [k for k in keys if k not in set(blocked)]
        keep = set((blocked + rest)[:max_rows])
        hidden = len(keys) - len(keep)
        keys = [k for k in keys if k in keep]
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.32 * max(len(keys), 1)))
    end = max((s.start_us + s.dur_us for s in spans), default=1.0) or 1.0
    # Blocked-forever spans run off to the right edge: leave room for them and their labels.
    right = end * (1.35 if any(s.blocked for s in spans) else 1.02)
    for y, key in enumerate(keys):
        for s in rows[key]:
            state = s.args.get("state", "busy")
            if state == "busy":
                ax.broken_barh([(s.start_us, max(s.dur_us, end * 1e-4))], (y - 0.4, 0.8),
                               facecolors=_COLORS.get(s.args.get("op"), "#999999"), edgecolor="white",
                               linewidth=0.3)
            elif state == "wait":
                ax.broken_barh([(s.start_us, s.dur_us)], (y - 0.25, 0.5), facecolors="none",
                               edgecolor="#BBBBBB", hatch="///", linewidth=0.0)
            else:  # blocked until the end: the deadlock
                ax.broken_barh([(s.start_us, right - s.start_us)], (y - 0.4, 0.8), facecolors="#E45756",
                               edgecolor="black", linewidth=0.6)
                ax.text(s.start_us, y, " blocked: " + s.name.replace("BLOCKED: ", ""), va="center", fontsize=7)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"rank {r} {t}" for r, t in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (us)")
    ax.set_xlim(0, right)
    ax.set_title(title + (f"  ({hidden} more rows not shown)" if hidden else ""), fontsize=9)
    ax.legend(handles=[Patch(color=_COLORS["compute"], label="compute"),
                       Patch(color=_COLORS["collective"], label="collective"),
                       Patch(color=_COLORS["send"], label="send/recv"),
                       Patch(facecolor="none", edgecolor="#BBBBBB", hatch="///", label="waiting"),
                       Patch(color="#E45756", label="blocked forever")],
              loc="upper center", bbox_to_anchor=(0.5, -0.12 - 2.0 / (len(keys) + 4)), fontsize=7, ncol=5,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
