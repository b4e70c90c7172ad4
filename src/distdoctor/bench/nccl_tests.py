"""bench in nccl-tests' own formats: the text table (with -I's per-iteration columns) and the -J JSON document.

The JSON document follows nccl-tests' `-J FILE` output (src/util.cu of NVIDIA/nccl-tests, JSON_FILE_VERSION 3)
field for field, so that its `tools/analyze_perf_json.py` and dashboards built on that output read ours:

    {"version": 3, "start_time", "args": [...], "env": [...], "nccl_version",
     "config": {"nthreads", "ngpus", "minimum_bytes", "maximum_bytes", "step_factor", "warmup_iters",
                "iterations", "aggregated_iterations", "validation", "graph", "blocking_collectives",
                "per_iter_timing", "per_iter_skip", "parallel_init",
                "devices": [{"rank", "group", "pid", "hostname", "device", "device_hex", "device_info"}]},
     "results": [{"size", "count", "type", "redop", "root",
                  "out_of_place": {"time", "alg_bw", "bus_bw", "nwrong"} | null, "out_of_place_per_iter": {...},
                  "in_place": {...} | null, "in_place_per_iter": {...},
                  "actual_iterations", "experiment_name"}],
     "out_of_bounds": {"count", "okay"}, "average_bus_bandwidth": {"bandwidth", "okay"}, "errors": [...],
     "end_time"}

`*_per_iter` (only with -I): {"skipped_iterations", "min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us",
"stdev_us", "cv_pct", "times_us": per-iteration max over ranks, "per_process_max_times_us": one list per rank}.
As in nccl-tests, booleans of `config` and `okay` are the strings "true"/"false", `root` is the text of the
table's root column (`%6i`), and a placement torch.distributed does not have is `null` (nccl-tests writes null
for a placement it did not run). Differences that are values, not layout: `time` is the slowest rank's mean (the
table's), `nccl_version` is 0 without NCCL, a CPU rank's `device` is -1, `experiment_name` names the distdoctor
op, and `env` lists only the NCCL_/GLOO_/TORCH_/MASTER_ variables (not the whole environment).
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import sys

from distdoctor.collectives import get_spec
from distdoctor.collectives.base import NCCL_TYPE_NAMES

JSON_FILE_VERSION = 3
PER_ITER_KEYS = ("skipped_iterations", "min_us", "max_us", "avg_us", "p50_us", "p95_us", "p99_us", "stdev_us",
                 "cv_pct", "times_us", "per_process_max_times_us")
_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "MASTER_")


# ---------------------------------------------------------------------------------------------- -I statistics
def _percentile_index(n: int, pct: int) -> int:
    return min(n - 1, (n * pct + 99) // 100 - 1)  # nccl-tests' computeIterStats


def iteration_stats(per_rank_us: list[list[float]], skip: int = 0) -> dict:
    """nccl-tests -I statistics of one row: each iteration's time is the max over ranks (a collective takes as
    long as its slowest rank); min/max/avg/p50/p95/p99/stdev (population)/cv% over those, after `skip`."""
    n_iters = min(len(t) for t in per_rank_us)
    times = [max(t[i] for t in per_rank_us) for i in range(n_iters)]
    summary = sorted(times[skip:])
    avg = statistics.fmean(summary)
    stdev = math.sqrt(statistics.fmean((t - avg) ** 2 for t in summary))
    n = len(summary)
    return {"skipped_iterations": skip, "min_us": summary[0], "max_us": summary[-1], "avg_us": avg,
            "p50_us": summary[n // 2], "p95_us": summary[_percentile_index(n, 95)],
            "p99_us": summary[_percentile_index(n, 99)], "stdev_us": stdev,
            "cv_pct": stdev / avg * 100 if avg > 0 else 0.0, "times_us": times,
            "per_process_max_times_us": [list(t[:n_iters]) for t in per_rank_us]}


# ---------------------------------------------------------------------------------------------- text table
def float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: the most decimals (2, 1, 0) that fit the column, else exponent notation."""
    for fmt in (f"%{width}.2f", f"%{width}.1f", f"%{width}.0f"):
        text = fmt % value
        if len(text) <= width:
            return text
    return (f"%{width}.1e" if width >= 7 else f"%{width}.0e") % value


def table_rows(report: dict):
    """One line of nccl-tests' table per size: (count, {in-place?: row}, a row of it, root or -1)."""
    by_count: dict[int, dict[bool, dict]] = {}
    for row in report["rows"]:
        by_count.setdefault(row["count"], {})[row["inplace"]] = row
    for count, pair in by_count.items():
        first = next(iter(pair.values()))
        yield count, pair, first, first["root"] if first["root"] is not None else -1


def _time_str(us: float) -> str:
    # nccl-tests switches precision with magnitude so the column stays 7 wide
    return f"{us:7.0f}" if us >= 10000 else (f"{us:7.1f}" if us >= 100 else f"{us:7.2f}")


def format_table(report: dict, opts) -> str:
    """The nccl-tests table, column for column, so it diffs against an nccl-tests run (and, with -I, the four
    per-iteration columns i_min, i_max, i_p99, i_cv% after each placement, as nccl-tests -I prints them)."""
    per_iter = any("per_iter" in row for row in report["rows"])
    lines = [
        f"# distdoctor bench: {opts.op}, {report['world_size']} ranks, {report['backend']} on {report['device']}"
        + (f", iface {report['iface']}" if report.get("iface") else ""),
        f"# nThread 1 nGpus 1 minBytes {opts.minbytes} maxBytes {opts.maxbytes} step: {opts.stepfactor}(factor) "
        f"warmup iters: {opts.warmup} iters: {opts.iters} agg iters: 1 validation: {int(opts.check)} graph: 0",
    ]
    if per_iter:
        lines.append("# Per-Iteration Report: i_* uses max over ranks")
    lines.append("#")
    for r, host in report["rank_hosts"].items():
        lines.append(f"#  Rank {int(r):2d} Group  0 on {host} device {report['device']}")
    lines.append("#")
    if per_iter:
        lines += [
            "# %10s  %12s  %8s  %6s  %6s              out-of-place (+ per-iteration)                                "
            "in-place (+ per-iteration)" % ("", "", "", "", ""),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  "
            "%7s" % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "i_min", "i_max",
                     "i_p99", "i_cv%", "time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%"),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  %7s  %7s  %6s  %6s  %6s  %7s  %7s  %7s  "
            "%7s" % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)",
                     "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(us)", "(us)", "(%)"),
        ]
    else:
        lines += [
            "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
            % ("", "", "", "", ""),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s" % (
                "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
                "busbw", "#wrong"),
            "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s" % (
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
        ]
    for count, pair, first, root in table_rows(report):
        line = "%12d  %12d  %8s  %6s  %6d" % (first["size_bytes"], count, NCCL_TYPE_NAMES.get(opts.dtype, opts.dtype),
                                              first["redop"] or "none", root)
        for inplace in (False, True):
            row = pair.get(inplace)
            if row is None:
                line += "  %7s  %6s  %6s  %5s" % ("N/A", "N/A", "N/A", "N/A")
                if per_iter:
                    line += "  %7s  %7s  %7s  %7s" % ("N/A", "N/A", "N/A", "N/A")
                continue
            wrong = "N/A" if row["wrong"] is None else "%g" % row["wrong"]
            line += "  %7s  %6.2f  %6.2f  %5s" % (_time_str(row["time_us"]), row["algbw_gbps"], row["busbw_gbps"],
                                                   wrong)
            if per_iter:
                it = row.get("per_iter") or {}
                line += "".join("  " + (float_str(it[k], 7) if k in it else "%7s" % "N/A")
                                for k in ("min_us", "max_us", "p99_us", "cv_pct"))
        lines.append(line)
    missing = [name for inplace, name in ((False, "out-of-place"), (True, "in-place"))
               if any(pair.get(inplace) is None for _, pair, _, _ in table_rows(report))]
    if missing:  # say why the columns are empty: not a failure, no call exists to time
        lines.append(f"# N/A: torch.distributed has no {' or '.join(missing)} form of {opts.op} (its "
                     f"{'result overwrites the input' if missing == ['out-of-place'] else 'call takes other buffers'}"
                     f"), so there is nothing to time in those columns")
    wrong_total = sum(r["wrong"] or 0 for r in report["rows"])
    lines.append(f"# Out of bounds values : {wrong_total} {'OK' if not wrong_total else 'FAILED'}")
    lines.append(f"# Avg bus bandwidth    : {report['avg_busbw_gbps']:g} ")
    lines.append("#")
    rel = report.get("per_rank_time_us") or {}
    if rel:
        slow = max(rel, key=lambda r: rel[r])
        lines.append("# Per-rank time / median rank: " + "  ".join(f"{r}:{v:.2f}" for r, v in rel.items())
                     + f"  (slowest: rank {slow} on {report['rank_hosts'].get(slow, '?')})")
    if "baseline" in report:
        from distdoctor.bench.baseline import format_baseline

        lines += format_baseline(report["baseline"])
    if "links" in report:
        from distdoctor.bench.links import format_links

        lines += format_links(report)
    for lost in report["lost"]:
        lines.append(f"# Lost: rank {lost['rank']} on {lost['host']}: {lost['reason']}"
                     + (f", in {lost['in_op']}" if lost.get("in_op") else ""))
    lines.append("# " + ("PASS" if report["passed"] else "FAIL: " + "; ".join(report["failures"])))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- -J document
def _now() -> str:
    return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")  # nccl-tests' TIME_STRING_FORMAT


def _nccl_version() -> int:
    """NCCL's version code as nccl-tests writes it (e.g. 22703 for 2.27.3), 0 where there is no NCCL."""
    try:
        import torch

        if not torch.cuda.is_available():
            return 0
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a CPU build has no NCCL to ask
        return 0
    if isinstance(version, tuple):
        major, minor, patch = (list(version) + [0, 0, 0])[:3]
        return major * 10000 + minor * 100 + patch if (major, minor) >= (2, 9) else major * 1000 + minor * 100 + patch
    return int(version)


def _bool(value: bool) -> str:
    return "true" if value else "false"  # nccl-tests' jsonBool writes strings


def _placement(row: dict | None) -> dict | None:
    if row is None:
        return None
    return {"time": row["time_us"], "alg_bw": row["algbw_gbps"], "bus_bw": row["busbw_gbps"],
            "nwrong": None if row["wrong"] is None else float(row["wrong"])}


def nccl_tests_json(report: dict, opts, start_time: str, argv: list[str] | None = None) -> dict:
    """The -J document of one bench report (see the module docstring)."""
    spec = get_spec(opts.op)
    per_iter = any("per_iter" in row for row in report["rows"])
    devices = []
    for r, host in report["rank_hosts"].items():
        device = (report.get("rank_devices") or {}).get(r)
        devices.append({"rank": int(r), "group": 0, "pid": (report.get("rank_pids") or {}).get(r) or 0,
                        "hostname": host, "device": -1 if device is None else device, "device_hex": "",
                        "device_info": f"{report['device']} ({report['backend']})"})
    results = []
    for count, pair, first, root in table_rows(report):
        res = {"size": first["size_bytes"], "count": count, "type": NCCL_TYPE_NAMES.get(opts.dtype, opts.dtype),
               "redop": first["redop"] or "none", "root": "%6i" % root}
        for key, inplace in (("out_of_place", False), ("in_place", True)):
            res[key] = _placement(pair.get(inplace))
            if per_iter and pair.get(inplace) is not None and "per_iter" in pair[inplace]:
                res[f"{key}_per_iter"] = {k: pair[inplace]["per_iter"][k] for k in PER_ITER_KEYS}
        res["actual_iterations"] = opts.iters
        res["experiment_name"] = f"distdoctor bench --op {spec.name}"
        results.append(res)
    wrong = int(sum(r["wrong"] or 0 for r in report["rows"]))
    bw_ok = "unchecked" if opts.min_busbw is None else _bool(report["avg_busbw_gbps"] >= opts.min_busbw)
    return {
        "version": JSON_FILE_VERSION,
        "start_time": start_time,
        "args": list(sys.argv if argv is None else argv),
        "env": [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)],
        "nccl_version": _nccl_version() if report["backend"] == "nccl" else 0,
        "config": {"nthreads": 1, "ngpus": 1, "minimum_bytes": opts.minbytes, "maximum_bytes": opts.maxbytes,
                   "step_factor": opts.stepfactor, "warmup_iters": opts.warmup, "iterations": opts.iters,
                   "aggregated_iterations": 1, "validation": int(opts.check), "graph": 0,
                   "blocking_collectives": _bool(False), "per_iter_timing": _bool(per_iter), "per_iter_skip": 0,
                   "parallel_init": _bool(False), "devices": devices},
        "results": results,
        "out_of_bounds": {"count": wrong, "okay": _bool(wrong == 0)},
        "average_bus_bandwidth": {"bandwidth": report["avg_busbw_gbps"], "okay": bw_ok},
        "errors": list(report["failures"]),
        "end_time": _now(),
    }


def write_nccl_tests_json(path: str, report: dict, opts, start_time: str) -> None:
    import json

    from distdoctor.errors import InputError

    try:
        with open(path, "w") as f:
            json.dump(nccl_tests_json(report, opts, start_time), f, indent=1)
            f.write("\n")
    except OSError as exc:
        raise InputError(f"-J {path}", f"cannot write ({exc.strerror})") from None


__all__ = ["format_table", "iteration_stats", "nccl_tests_json", "write_nccl_tests_json", "float_str", "_now"]
