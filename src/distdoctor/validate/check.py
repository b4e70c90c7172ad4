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

import contextlib
import dataclasses
import json
import os
import sys
import time

import click

from distdoctor.cli import FORMAT_OPTION
from distdoctor.errors import CheckFailed
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


# ---------------------------------------------------------------------------------------------- text
def _not_run(r: dict) -> bool:
    return r["status"] == "skipped" and (r.get("reason") or "").startswith("not run")


def _counts(validate: dict) -> tuple[int, int, int]:
    """(passed, failed, skipped) — checks the world never reached are not counted as skipped."""
    rows = validate["results"]
    return (sum(r["status"] == "pass" for r in rows), sum(r["status"] == "fail" for r in rows),
            sum(r["status"] == "skipped" and not _not_run(r) for r in rows))


def _where(report: dict) -> str:
    device = "GPU" if report["device"] == "cuda" else "CPU"
    iface = f", iface {report['iface']}" if report.get("iface") else ""
    return f"{report['world_size']} ranks, {report['backend']} on {device}{iface}"


def _peak(bench: dict) -> dict | None:
    return max(bench["rows"], key=lambda r: r["busbw_gbps"], default=None)


def verdict(report: dict) -> str:
    """One line a person reads in five seconds."""
    validate, bench = report["validate"], report["bench"]
    n_pass, n_fail, n_skip = _counts(validate)
    if report["passed"]:
        peak = _peak(bench)
        bw = f"all_reduce busbw {peak['busbw_gbps']:.2f} GB/s at {_size(peak['size_bytes'])}" if peak else "no bench"
        return (f"PASS: collectives correct on {_where(report)} ({n_pass} checks passed, {n_skip} skipped); "
                f"{bw}")
    reasons = []
    for lr in report["lost"]:
        reasons.append(f"rank {lr['rank']} lost ({lr['reason']}" + (f", in {lr['in_op']})" if lr["in_op"] else ")"))
    for c in validate.get("culprits", []):
        if not any(f"rank {c['rank']} lost" in r for r in reasons):
            reasons.append(f"rank {c['rank']}: {'; '.join(c['why'][:2])}")
    if n_fail and not reasons:
        reasons.append(f"{n_fail} of {len(validate['results'])} checks failed")
    for why in bench.get("failures", []):
        if not why.startswith("lost"):
            reasons.append(f"bench: {why}")
    return f"FAIL on {_where(report)}: " + "; ".join(reasons or ["see the validate and bench parts"])


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def format_check(report: dict) -> str:
    env, validate, bench = report["env"], report["validate"], report["bench"]
    n_pass, n_fail, n_skip = _counts(validate)
    groups = sorted({r["group"].split("[")[0] for r in validate["results"]})
    ops = sorted({r["op"] for r in validate["results"]})
    rows = bench["rows"]
    lines = [report["verdict"], ""]
    count = env["device_count"]
    gpus = (f"{count} GPU" + ("s" if count != 1 else "")) if count else "no GPU"
    backends = ", ".join(env["available_backends"]) or "none"
    lines.append(f"  env       torch {env['torch_version']}, backends {backends}, {gpus}, {env['cpu_count']} CPUs "
                 f"-> {env['mode']}")
    n_not_run = sum(_not_run(r) for r in validate["results"])
    not_run = f", {n_not_run} not run" if n_not_run else ""
    lines.append(f"  validate  {'PASS' if validate['passed'] else 'FAIL'}: {n_pass} passed, {n_fail} failed, "
                 f"{n_skip} skipped{not_run} ({len(ops)} collectives x {', '.join(QUICK_VALIDATE['dtypes'])}; "
                 f"groups {', '.join(groups)})")
    if rows:
        peak = _peak(bench)
        wrong = sum(r["wrong"] or 0 for r in rows)
        lines.append(f"  bench     all_reduce {_size(rows[0]['size_bytes'])}..{_size(rows[-1]['size_bytes'])}: "
                     f"avg busbw {bench['avg_busbw_gbps']:.2f} GB/s, peak {peak['busbw_gbps']:.2f} GB/s at "
                     f"{_size(peak['size_bytes'])}, {wrong} wrong")
    else:
        why = f" ({'; '.join(bench['failures'])})" if bench.get("failures") else ""
        lines.append("  bench     not measured" + why)
    for lr in report["lost"]:
        lines.append(f"  lost      rank {lr['rank']} on {lr['host']}: {lr['reason']}"
                     + (f", in {lr['in_op']}" if lr["in_op"] else ""))
    failures = [r for r in validate["results"] if r["status"] == "fail"]
    for r in failures[:5]:
        lines.append(f"  failed    {r['op']} {r['dtype']} count={r['count']} on {r['group']}: {r['reason'][:100]}")
    if len(failures) > 5:
        lines.append(f"            … and {len(failures) - 5} more (run `distdoctor validate` for the full table)")
    lines.append(f"  took      {report['wall_s']:.1f} s")
    return "\n".join(lines)


@contextlib.contextmanager
def check_progress(n_hint: str):
    """Progress on stderr: a rich bar per stage on a terminal, one line per stage otherwise.

    The live display is started only at the first progress event, i.e. once the workers exist: CPU workers are
    forked, and no display thread should be running (and holding the stderr lock) at fork time.
    """
    from distdoctor.world.launchers import detect

    launch = detect()
    quiet = launch is not None and launch.rank != 0  # under a launcher only rank 0 speaks
    if not quiet:
        click.echo(f"distdoctor check: starting {n_hint} …", err=True)
    state: dict = {"progress": None, "tasks": {}, "stage": None}
    tty = sys.stderr.isatty()

    def on_event(ev: dict) -> None:
        if ev.get("type") != "progress":
            return
        stage = ev.get("stage") or "run"
        if quiet:
            return
        if not tty:
            if stage != state["stage"]:
                state["stage"] = stage
                click.echo(f"distdoctor check: {stage} …", err=True)
            return
        if state["progress"] is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            state["progress"] = Progress(TextColumn("{task.fields[stage]:<9}"), BarColumn(), MofNCompleteColumn(),
                                         TextColumn("{task.description}"), TimeElapsedColumn(),
                                         console=Console(file=sys.stderr), transient=True)
            state["progress"].start()
        tasks = state["tasks"]
        if stage not in tasks:
            for other in tasks.values():  # the earlier stage is complete once the next one reports
                task = state["progress"].tasks[other]
                state["progress"].update(other, completed=task.total or task.completed)
            tasks[stage] = state["progress"].add_task(ev.get("what", ""), total=ev["total"], stage=stage)
        state["progress"].update(tasks[stage], completed=ev["done"], total=ev["total"], description=ev.get("what", ""))

    try:
        yield on_event
    finally:
        if state["progress"] is not None:
            state["progress"].stop()


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
    from distdoctor.world import resolve_backend, resolve_nproc, under_launcher

    cfg = config_from_options(**world_kw)
    quick_options(inject)  # bad --inject: one line, before any rank starts
    n = resolve_nproc(cfg)
    hint = f"a world of {n} ranks (joining the launcher's)" if under_launcher() else \
        f"{n} {resolve_backend(cfg, n)} ranks"
    with check_progress(hint) as on_event:
        report = run_check(cfg, inject, on_event=on_event)
    if report is None:  # not the reporter
        return
    if html_file:
        from distdoctor.report.cluster_html import write_cluster_html

        write_cluster_html(html_file, check=report)
    if fmt == "json":
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    else:
        click.echo(format_check(report))
    if not report["passed"]:
        raise CheckFailed(1)
