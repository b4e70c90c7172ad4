"""`distdoctor validate`: the command line over the sweep (sweep.py); the report is rendered by report/."""

from __future__ import annotations

import json
import re

import click

from distdoctor.cli import FORMAT_OPTION, write_document
from distdoctor.collectives import SPECS
from distdoctor.collectives.base import DTYPES, REDOPS
from distdoctor.errors import CheckFailed
from distdoctor.options import SEED, seconds
from distdoctor.validate.sweep import DEFAULT_SIZES, VALIDATE_OPS, ValidateOptions, run_validate
from distdoctor.world import config_from_options, world_options


def _split(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(v.strip() for v in re.split(r"[,\s]+", value) if v.strip())


@click.command("validate")
@world_options
@click.option("--sizes", default=DEFAULT_SIZES, show_default=True,
              help="Comma-separated counts (elements; K/M/G = 2^10/2^20/2^30) or byte sizes (B, KiB, MiB, GiB).")
@click.option("--ops", default=None, help=f"Comma-separated collectives (default all: {', '.join(SPECS)}).")
@click.option("--dtypes", default=None, help=f"Comma-separated dtypes (default: {', '.join(DTYPES)}).")
@click.option("--redops", default=None, help=f"Reduction ops to check (default: {', '.join(REDOPS)}).")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the deterministic inputs.")
@click.option("--no-subgroups", is_flag=True, help="Only the world group (skip the 2-D mesh subgroups).")
@click.option("--inject", multiple=True, metavar="KIND:RANK[:ARG]",
              help="Plant a fault: corrupt:R[:N], delay:R:SECONDS, crash:R[:N], skip:R[:N]. Repeatable.")
@click.option("--straggler-threshold", "straggler_s", default=0.1, show_default=True, type=seconds(low_open=True),
              help="Seconds of median lateness at which a rank is reported as a straggler.")
@click.option("--html", "html_file", default=None, type=click.Path(dir_okay=False),
              help="Also write a self-contained HTML report to FILE (verdict, failed checks, per-rank lateness).")
@FORMAT_OPTION
def validate_command(sizes, ops, dtypes, redops, seed, no_subgroups, inject, straggler_s, html_file, fmt,
                     **world_kw):
    """Check every collective's result against an exact float64 reference, on every rank and group."""
    from distdoctor.report.progress import progress_display
    from distdoctor.report.validate_text import print_validate

    cfg = config_from_options(**world_kw)
    opts = ValidateOptions(ops=_split(ops) or VALIDATE_OPS, dtypes=_split(dtypes) or DTYPES, sizes=sizes,
                           seed=seed, inject=tuple(inject), redops=_split(redops) or REDOPS,
                           subgroups=not no_subgroups, straggler_s=straggler_s)
    opts.check()
    with progress_display("validate") as on_event:
        report = run_validate(cfg, opts, on_event=on_event)
    if report is None:  # a non-reporting rank under torchrun
        return
    if html_file:
        from distdoctor.report.cluster_html import write_cluster_html

        write_cluster_html(html_file, validate=report)
    if fmt == "json":
        write_document(json.dumps(report))
    else:
        print_validate(report)
    if not report["passed"]:
        raise CheckFailed(1)
