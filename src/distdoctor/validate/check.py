"""`distdoctor check`: the first thing to run on a machine. Environment, a quick validate and a quick bench in
ONE world (starting the ranks is most of a quick run's wall time, so validate and bench share it), one verdict.

The world is the default one (every GPU over NCCL where there are several, else 4 CPU processes over gloo),
or whatever torchrun gives. Each rank runs the validate loop and then the bench loop
(`validate.validate_worker`, `bench.bench_worker`); their records are told apart by their `kind`, so the
reporter folds the same JobResult with `summarize_validate` and `summarize_bench` into the two reports the
`validate` and `bench` commands would give. Quick means: every collective, the world and the 2-D mesh groups,
float32 (the common case) and bfloat16 (the low-precision path, where reductions go wrong), sizes 0, 1023 and
64 KiB, sum and max; bench: all_reduce from 1 KiB to 4 MiB. `distdoctor validate` is the full sweep (six dtypes,
five reductions); the quick set keeps check well under a minute on 2 cores.

Passed = every check passed (skips are allowed and counted), no rank lost, and bench measured every row with
no wrong element.
"""

from __future__ import annotations

import dataclasses
import json
import time

import click

from distdoctor.cli import FORMAT_OPTION, write_document
from distdoctor.errors import CheckFailed
from distdoctor.report.check_text import format_check, verdict
from distdoctor.world import WorldConfig, config_from_options, run_job, world_options

QUICK_VALIDATE = dict(dtypes=("float32", "bfloat16"), sizes="0,1023,64KiB", redops=("sum", "max"))
QUICK_BENCH = dict(op="all_reduce", dtype="float32", minbytes=1 << 10, maxbytes=4 << 20, stepfactor=4, iters=10,
                   warmup=3, check=True)


def quick_options(inject: tuple[str, ...] = ()):
    from distdoctor.bench.sweep import BenchOptions
    from distdoctor.validate.sweep import ValidateOptions

    vopts = ValidateOptions(inject=tuple(inject), **QUICK_VALIDATE)
    bopts = BenchOptions(**QUICK_BENCH)
    vopts.check()
    bopts.validate()
    return vopts, bopts


def check_worker(ctx, validate: dict, bench: dict) -> dict:
    """Runs on every rank: the validate loop, then the bench loop, in the same process group."""
    from distdoctor.bench.sweep import bench_worker
    from distdoctor.validate.sweep import validate_worker

    ctx.stage = "validate"
    validated = validate_worker(ctx, **validate)
    ctx.stage = "bench"
    benched = bench_worker(ctx, **bench)
    return {"validate": validated, "bench": benched}


def _part(job, name: str):
    """The JobResult as the single-purpose command would have seen it (results narrowed to one part)."""
    return dataclasses.replace(job, results={r: (v or {}).get(name) for r, v in job.results.items()})


def run_check(cfg: WorldConfig, inject: tuple[str, ...] = (), on_event=None) -> dict | None:
    """Run the check; the report on the reporting rank, None on the others (under torchrun)."""
    from distdoctor.bench.sweep import summarize_bench
    from distdoctor.world.env import collect_env
    from distdoctor.world.faults import parse_faults
    from distdoctor.validate.sweep import summarize_validate
    from distdoctor.world import resolve_nproc

    start = time.time()
    vopts, bopts = quick_options(inject)
    parse_faults(vopts.inject, world_size=resolve_nproc(cfg))
    env = collect_env()
    job = run_job("distdoctor.validate.check:check_worker", {"validate": vopts.worker_args(), "bench": bopts.worker_args()},
                  cfg, on_event=on_event)
    if not job.is_reporter:
        return None
    validate = summarize_validate(_part(job, "validate"), vopts)
    bench = summarize_bench(_part(job, "bench"), bopts)
    lost = [dataclasses.asdict(lr) for lr in job.lost]
    passed = bool(validate["passed"] and bench["passed"] and job.ok)
    report = {
        "passed": passed,
        "world_size": job.world_size,
        "backend": job.backend,
        "device": job.device,
        "iface": job.iface,
        "mode": job.mode,
        "lost": lost,
        "env": env,
        "validate": validate,
        "bench": bench,
        "wall_s": round(time.time() - start, 2),
    }
    report["verdict"] = verdict(report)
    return report


@click.command("check")
@world_options
@click.option("--inject", multiple=True, metavar="KIND:RANK[:ARG]",
              help="Plant a fault in the validate part (as `distdoctor validate --inject`), to see check fail.")
@click.option("--html", "html_file", default=None, type=click.Path(dir_okay=False),
              help="Also write a self-contained HTML report to FILE (verdict, failed checks, busbw vs size, "
                   "per-rank timing).")
@FORMAT_OPTION
def check_command(fmt: str, inject: tuple[str, ...], html_file: str | None, **world_kw) -> None:
    """The main job: environment, quick validate and quick bench in one world, one verdict."""
    from distdoctor.report.progress import check_progress
    from distdoctor.world import resolve_backend, resolve_nproc, under_launcher
    from distdoctor.world.launchers import detect

    cfg = config_from_options(**world_kw)
    quick_options(inject)  # bad --inject: one line, before any rank starts
    n = resolve_nproc(cfg)
    hint = f"a world of {n} ranks (joining the launcher's)" if under_launcher() else \
        f"{n} {resolve_backend(cfg, n)} ranks"
    launch = detect()
    with check_progress(hint, quiet=launch is not None and launch.rank != 0) as on_event:  # only rank 0 speaks
        report = run_check(cfg, inject, on_event=on_event)
    if report is None:  # not the reporter
        return
    if html_file:
        from distdoctor.report.cluster_html import write_cluster_html

        write_cluster_html(html_file, check=report)
    if fmt == "json":
        write_document(json.dumps(report, indent=2, default=str))
    else:
        click.echo(format_check(report))
    if not report["passed"]:
        raise CheckFailed(1)
