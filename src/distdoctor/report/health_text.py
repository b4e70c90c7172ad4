"""Text rendering of a HealthMonitor summary (rich table, exported as plain text)."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table


def _fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def render_summary(summary: dict) -> str:
    table = Table(title=f"training health after {summary['steps']} steps")
    for col in ("rank", "step ms", "compute ms", "wait ms", "score", "peak MiB", "replica", "first non-finite"):
        table.add_column(col, justify="left" if col in ("replica", "first non-finite") else "right")
    for r in summary["ranks"]:
        nf = r["first_nonfinite"]
        table.add_row(str(r["rank"]), _fmt(r["step_ms"]), _fmt(r["compute_ms"]), _fmt(r["wait_ms"]),
                      _fmt(r["straggler_score"]), _fmt(r["peak_mib"], ".0f"), "ok" if r["replica_ok"] else "DIFFERS",
                      "-" if nf is None else f"step {nf['step']} {nf['phase']} {nf['module']}")
    console = Console(record=True, width=120, file=io.StringIO(), force_jupyter=False)  # text, even in a notebook
    console.print(table)
    if summary["events"]:
        for e in summary["events"]:
            console.print(f"[bold]{e['kind']}[/bold] step {e['step']} ranks {e['ranks']}: {e['detail']}")
    else:
        console.print("no problems seen")
    return console.export_text()
