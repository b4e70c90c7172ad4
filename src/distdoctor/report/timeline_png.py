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


def write_timeline_png(spans: list[Span], path: str | Path, title: str = "timeline", max_rows: int = 48,
                       total_rows: int | None = None) -> None:
    """Draw the spans; `total_rows` says how many rows exist when the caller already left some out."""
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
        # one broken_barh call per row and kind: thousands of spans draw in well under a second
        bars: dict[str, list[tuple[float, float]]] = {}
        waits: list[tuple[float, float]] = []
        for s in rows[key]:
            state = s.args.get("state", "busy")
            if state == "busy":
                bars.setdefault(_COLORS.get(s.args.get("op"), "#999999"), []).append(
                    (s.start_us, max(s.dur_us, end * 1e-4)))
            elif state == "wait":
                waits.append((s.start_us, s.dur_us))
            else:  # blocked until the end: the deadlock
                ax.broken_barh([(s.start_us, right - s.start_us)], (y - 0.4, 0.8), facecolors="#E45756",
                               edgecolor="black", linewidth=0.6)
                ax.text(s.start_us, y, " blocked: " + s.name.replace("BLOCKED: ", ""), va="center", fontsize=7)
        for color, xr in bars.items():
            ax.broken_barh(xr, (y - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.3)
        if waits:
            ax.broken_barh(waits, (y - 0.25, 0.5), facecolors="none", edgecolor="#BBBBBB", hatch="///",
                           linewidth=0.0)
    ax.set_yticks(range(len(keys)))
    ax.set_yticklabels([f"rank {r} {t}" for r, t in keys], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (us)")
    ax.set_xlim(0, right)
    if total_rows is not None:
        hidden = max(total_rows - len(keys), hidden)
    ax.set_title(title + (f"  ({hidden} more rows not shown)" if hidden else ""), fontsize=9)
    height = fig.get_size_inches()[1]
    fig.legend(handles=[Patch(color=_COLORS["compute"], label="compute"),
                        Patch(color=_COLORS["collective"], label="collective"),
                        Patch(color=_COLORS["send"], label="send/recv"),
                        Patch(facecolor="none", edgecolor="#BBBBBB", hatch="///", label="waiting"),
                        Patch(color="#E45756", label="blocked forever")],
               loc="lower center", fontsize=7, ncol=5, frameon=False)
    fig.tight_layout(rect=(0, 0.3 / height, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
