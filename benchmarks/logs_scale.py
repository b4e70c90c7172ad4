"""Per-rank text logs at scale: `distdoctor diagnose` on glog before:/after: logs of 8 x 5 000 and 1024 x 20 000 lines.

    python benchmarks/logs_scale.py [--sets 8x5000,1024x20000] [--data DIR] [--rounds N]

Generates each set once (kept under --data, default a temp dir) with the tests' builder of the seed-style stalled
pipeline (tests/doctor/scenarios/pipeline_logs.py: glog's rank<r>/ folders with the oneflow.INFO link and a WARNING
file, a source, forward, backward and NCCL thread per rank, 48 blocks per stage, 4 micro-batches, iterations until
the line count; the first half of the ranks stuck in the gradient receive; a few unreadable lines), then times
`python -m distdoctor diagnose DIR --format json` in a fresh child process: wall seconds, CPU seconds (all its
processes), peak RSS of its largest process (the median of --rounds runs). Beside each run, in the same round, it
times `grep -r -c -F '] before: ' DIR` on the same files: a bare scan of the bytes, so the ratio says how the
reading compares with the floor on this (shared, noisy) machine. Prints a JSON summary and the markdown rows for
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "doctor" / "scenarios"))
from diagnose_scale import timed_child  # noqa: E402 - benchmarks/ is this script's folder
from pipeline_logs import rank_log, write_pipeline_logs  # noqa: E402

MICRO, BLOCKS = 4, 48


def iterations_for(lines: int, ranks: int) -> int:
    """Iterations that give each rank about `lines` lines (stage 0's count; stage 1 writes a few more)."""
    one = rank_log(0, ranks, 1, MICRO, BLOCKS, faults=False)[1]["lines"]
    two = rank_log(0, ranks, 2, MICRO, BLOCKS, faults=False)[1]["lines"]
    return max(2, round((lines - one) / (two - one)) + 1)


def _write_part(args: tuple) -> dict:
    out, ranks, iterations, part, parts = args
    return write_pipeline_logs(Path(out), ranks=ranks, iterations=iterations, micro=MICRO, blocks=BLOCKS,
                               only=range(part, ranks, parts))


def generate(data: Path, ranks: int, lines: int) -> dict:
    stamp = data.parent / f"{data.name}.ready.json"  # beside the set, not in it: diagnose reads every file there
    if stamp.exists():
        return json.loads(stamp.read_text())
    iterations = iterations_for(lines, ranks)
    parts = os.cpu_count() or 1
    with multiprocessing.get_context("fork").Pool(parts) as pool:
        built = pool.map(_write_part, [(str(data), ranks, iterations, p, parts) for p in range(parts)])
    facts = {r: f for b in built for r, f in b["facts"].items()}
    info = {"ranks": ranks, "iterations": iterations, "lines": sum(f["lines"] for f in facts.values()),
            "bytes": sum(p.stat().st_size for p in data.rglob("*") if p.is_file() and not p.is_symlink()),
            "stuck_op": built[0]["stuck_op"]}
    stamp.write_text(json.dumps(info))
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="8x5000,1024x20000", help="RANKSxLINES,... (lines per rank)")
    ap.add_argument("--data", default=None, help="keep the generated logs here (default: a temp dir, removed)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    tmp = None if args.data else tempfile.TemporaryDirectory(prefix="distdoctor-logs-")
    base = Path(args.data or tmp.name)
    rows, summary = [], []
    try:
        for spec in args.sets.split(","):
            ranks, lines = (int(x) for x in spec.lower().split("x"))
            data = base / f"{ranks}x{lines}"
            t = time.perf_counter()
            info = generate(data, ranks, lines)
            print(f"{spec}: logs ready in {time.perf_counter() - t:.1f} s under {data}", file=sys.stderr)
            env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
            report = str(data.parent / f"{data.name}.report.json")
            load_before = os.getloadavg()
            runs, greps = [], []
            for _ in range(args.rounds):
                runs.append(timed_child([sys.executable, "-m", "distdoctor", "diagnose", str(data), "--format", "json"],
                                        args.timeout, env, report))
                # to a file: GNU grep stops at the first match when its output is /dev/null
                greps.append(timed_child(["grep", "-r", "-c", "-F", "] before: ", str(data)], args.timeout,
                                         stdout_path=str(data.parent / f"{data.name}.grep.out")))
            run = dict(sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2])
            grep = sorted(greps, key=lambda r: r["wall_s"])[len(greps) // 2]
            run.pop("stderr", None)
            if run["rc"] in (0, 1):
                doc = json.loads(Path(report).read_text())
                run["findings"] = [(f["kind"], len(f["ranks"]), f["op"]) for f in doc["findings"]]
                run["skipped_lines"] = sum(p.get("log", {}).get("skipped_lines", 0) for p in doc["ranks"].values())
            entry = {"set": spec, **info, "cpus": os.cpu_count(), "distdoctor": run,
                     "runs": [(r["wall_s"], r["cpu_s"], r["peak_rss_mb"]) for r in runs],
                     "grep": [(r["wall_s"], r["cpu_s"]) for r in greps],
                     "ratio_wall_distdoctor_over_grep": round(run["wall_s"] / max(grep["wall_s"], 0.05), 1),
                     "load_average_before": load_before, "load_average_after": os.getloadavg()}
            summary.append(entry)
            rows.append(f"| {ranks} x {lines:,} ({info['lines']:,} lines, {info['bytes'] / 2**20:,.0f} MiB) | "
                        f"{run['wall_s']} s | {run['cpu_s']} s | {run['peak_rss_mb']} MB | "
                        f"{grep['wall_s']} s / {grep['cpu_s']} s | "
                        f"{', '.join(f'{k} ({n} ranks)' for k, n, _ in run.get('findings', []))} |")
    finally:
        if tmp is not None:
            tmp.cleanup()
    print(json.dumps(summary, indent=1))
    print("\n".join(["| set | wall | CPU | peak RSS | grep wall / CPU | findings |", "|---|---|---|---|---|---|",
                      *rows]))


if __name__ == "__main__":
    main()
