"""`distdoctor bench`: the command line over the sweep (sweep.py), the link probe (links.py), nccl-tests' formats
(nccl_tests.py) and baselines (baseline.py)."""

from __future__ import annotations

import json

import click

from distdoctor.bench.nccl_tests import format_table
from distdoctor.bench.sweep import BENCH_OPS, BenchOptions, run_bench
from distdoctor.cli import FORMAT_OPTION, write_document
from distdoctor.collectives.base import DTYPES, REDOPS
from distdoctor.errors import CheckFailed
from distdoctor.options import InputFile, MiB, Number, count
from distdoctor.validate.execute import parse_size
from distdoctor.world import config_from_options, world_options

MAX_ITERS = 1_000_000
MAX_BASELINE = 16 * MiB  # a bench JSON or nccl-tests output is kilobytes; a bigger file is not one


def _bytes(ctx, param, value):
    if value is None:
        return None
    return parse_size(str(value), what=param.opts[0], force_bytes=True).value


@click.command("bench")
@world_options
@click.option("-b", "--minbytes", default="1K", show_default=True, callback=_bytes,
              help="Smallest size in bytes (K/M/G suffixes).")
@click.option("-e", "--maxbytes", default="16M", show_default=True, callback=_bytes,
              help="Largest size in bytes (K/M/G suffixes).")
@click.option("-f", "--stepfactor", default=4, show_default=True, type=count("x", 0, 1024),
              help="Multiply the size by this each step.")
@click.option("-n", "--iters", default=20, show_default=True, type=count("iterations", 0, MAX_ITERS), help="Timed iterations per size.")
@click.option("-w", "--warmup", default=5, show_default=True, type=count("iterations", 0, MAX_ITERS), help="Untimed warmup iterations per size.")
@click.option("-c", "--check", default=1, show_default=True, type=click.IntRange(0, 1),
              help="1: count elements off the exact reference (#wrong); 0: skip.")
@click.option("--op", default="all_reduce", show_default=True, help=f"Collective: {', '.join(BENCH_OPS)}.")
@click.option("-d", "--dtype", default="float32", show_default=True, help=f"Data type: {', '.join(DTYPES)}.")
@click.option("-o", "--redop", default="sum", show_default=True, help=f"Reduction: {', '.join(REDOPS)}.")
@click.option("-r", "--root", default=0, show_default=True, type=count("rank", 0, 1 << 20), help="Root rank of rooted collectives.")
@click.option("--min-busbw", default=None, type=Number("GB/s", 0, 1e9),
              help="Fail when the average bus bandwidth (GB/s) is below this (like NCCL_TESTS_MIN_BW).")
@click.option("--links", is_flag=True,
              help="After the sweep, time point-to-point transfers between every pair of hosts (one rank each) "
                   "and name a slow host.")
@click.option("--link-bytes", default="4M", show_default=True, callback=_bytes,
              help="Message size of the --links transfers (K/M/G suffixes; whole float32 elements, up to 4G).")
@click.option("--link-iters", default=10, show_default=True, type=count("transfers", 0, MAX_ITERS),
              help="Timed transfers per direction of each --links pair, spread over 3 passes (fewer where they "
                   "would take over 2 s).")
@click.option("-I", "--per-iter", type=click.IntRange(0, 1), is_flag=False, flag_value=1, default=0,
              help="1 (or -I alone): time every iteration and add i_min/i_max/i_p99/i_cv% per size, as nccl-tests -I.")
@click.option("-J", "--json-file", "json_file", default=None, type=click.Path(dir_okay=False),
              help="Also write nccl-tests' -J JSON document to FILE (its tools/analyze_perf_json.py reads it).")
@click.option("--baseline", default=None, type=InputFile(MAX_BASELINE, "a bench baseline"),
              help="Compare with an earlier run: distdoctor's bench JSON, or nccl-tests' -J JSON or text output.")
@click.option("--tolerance", "tolerance_pct", default=10.0, show_default=True, type=Number("percent", 0, 100),
              help="With --baseline: fail the sizes whose busbw is more than PCT percent below the baseline's.")
@click.option("--html", "html_file", default=None, type=click.Path(dir_okay=False),
              help="Also write a self-contained HTML report to FILE (busbw vs size, links, per-rank time).")
@FORMAT_OPTION
def bench_command(minbytes, maxbytes, stepfactor, iters, warmup, check, op, dtype, redop, root, min_busbw, links,
                  link_bytes, link_iters, per_iter, json_file, baseline, tolerance_pct, html_file, fmt, **world_kw):
    """Collective bandwidth with nccl-tests' algbw/busbw semantics and table."""
    from distdoctor.bench.nccl_tests import _now, write_nccl_tests_json
    from distdoctor.report.progress import progress_display

    cfg = config_from_options(**world_kw)
    opts = BenchOptions(op=op, dtype=dtype, redop=redop.lower(), root=root, minbytes=minbytes, maxbytes=maxbytes,
                        stepfactor=stepfactor, iters=iters, warmup=warmup, check=bool(check), min_busbw=min_busbw,
                        links=links, link_bytes=link_bytes, link_iters=link_iters, per_iter=bool(per_iter))
    opts.validate()
    base = None
    if baseline is not None:  # a bad baseline is refused before any rank starts
        from distdoctor.bench.baseline import load_baseline

        base = load_baseline(baseline)
    start_time = _now()
    with progress_display(f"bench {op}", unit="steps") as on_event:
        report = run_bench(cfg, opts, on_event=on_event, baseline=base, tolerance_pct=tolerance_pct)
    if report is None:
        return
    if json_file:
        write_nccl_tests_json(json_file, report, opts, start_time)
    if html_file:
        from distdoctor.report.cluster_html import write_cluster_html

        write_cluster_html(html_file, bench=report)
    if fmt == "json":
        write_document(json.dumps(report))
    else:
        click.echo(format_table(report, opts))
    if not report["passed"]:
        raise CheckFailed(1)
