"""Wall time of `distdoctor check` on the default world (4 gloo ranks on a CPU machine).

Runs `python -m distdoctor check --format json` N times (default 3) and reports the median wall time, the
time inside the check (after imports: world start, validate, bench, teardown) and, side by side in the same
run, a baseline: a bare `python -c "import torch.distributed"` (the part no harness can avoid). The machine
is shared and noisy, so the load average is printed with each figure.

    python benchmarks/check_wall.py [--runs 3] [--nproc 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def timed(cmd: list[str]) -> tuple[float, str]:
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return wall, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=None)
    args = parser.parse_args()
    check = [sys.executable, "-m", "distdoctor", "check", "--format", "json"]
    if args.nproc:
        check += ["--nproc", str(args.nproc)]
    baseline = [sys.executable, "-c", "import torch.distributed"]
    walls, inner, bases, loads = [], [], [], []
    for i in range(args.runs):
        loads.append(os.getloadavg()[0])
        base, _ = timed(baseline)
        wall, out = timed(check)
        doc = json.loads(out)
        assert doc["passed"], doc["verdict"]
        walls.append(wall)
        inner.append(doc["wall_s"])
        bases.append(base)
        print(f"run {i + 1}: check {wall:.1f} s (inside the check {doc['wall_s']:.1f} s), "
              f"import torch.distributed {base:.1f} s, load {loads[-1]:.1f}; "
              f"{doc['world_size']} ranks, {len(doc['validate']['results'])} validate checks, "
              f"{len(doc['bench']['rows'])} bench rows", flush=True)
    med = statistics.median(walls)
    print(f"\nmedian of {args.runs}: distdoctor check {med:.1f} s wall "
          f"(inside the check {statistics.median(inner):.1f} s); baseline import torch.distributed "
          f"{statistics.median(bases):.1f} s; ratio {med / statistics.median(bases):.1f}x; "
          f"cpus {os.cpu_count()}, load average {statistics.median(loads):.1f}")


if __name__ == "__main__":
    main()
