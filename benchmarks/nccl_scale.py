"""diagnose on 1024 ranks of simulated NCCL Flight Recorder dumps (sim/fr_nccl.py), the form the watchdog writes
(active-only) and full rings, as pickles and as JSON.

    python benchmarks/nccl_scale.py [--data DIR] [--rounds 3] [--baseline OTHER_CHECKOUT]

A Megatron-like mesh TP 8 x PP 8 x DP 16 (EP 8), 8 steps of 4 micro-batches, a GPU that stopped on two ranks.
Each run is `python -m distdoctor diagnose DIR --format json` in a fresh child process, timed (wall and CPU of the
whole process tree); with --baseline, the other checkout's diagnose alternates with it on the same dumps. Prints
one line per set: median wall, CPU, whether the first finding names only the faulty ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from distdoctor.sim.fr_nccl import Plan, write_set  # noqa: E402


def _sets(data: Path) -> dict[str, tuple[Path, list[int]]]:
    out = {}
    for active, form in ((True, "pickle"), (True, "json"), (False, "pickle"), (False, "json")):
        name = f"{'active' if active else 'full'}-{form}"
        plan = Plan(8, 8, 16, 8, steps=8, micro=4, fault="gpu_stall", faulty=[129, 275], at=0.5, active_only=active)
        d = data / name
        if not d.exists():
            truth = write_set(d, plan, seed=1, form=form)
            assert truth.faulty == [129, 275]
        out[name] = (d, [129, 275])
    return out


def _run(src: Path, d: Path) -> tuple[float, float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", str(d), "--format", "json"],
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(src)), timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("/tmp/distdoctor-nccl-scale"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout, run alternately")
    args = ap.parse_args()
    sides = [("this", ROOT / "src")] + ([("baseline", args.baseline / "src")] if args.baseline else [])
    print(f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cpus")
    for name, (d, faulty) in _sets(args.data).items():
        for side, src in sides:
            runs = [_run(src, d) for _ in range(args.rounds)]
            first = runs[-1][2]["findings"][0] if runs[-1][2]["findings"] else {}
            right = bool(first) and set(first["ranks"]) <= set(faulty)
            print(f"{name:<14} {side:<8} wall {' / '.join(f'{w:.2f}' for w, _, _ in runs)} s "
                  f"(median {statistics.median(w for w, _, _ in runs):.2f}), CPU median "
                  f"{statistics.median(c for _, c, _ in runs):.2f} s; first finding {first.get('kind')} "
                  f"{first.get('ranks')} ({'only faulty ranks' if right else 'WRONG'})")
    print(f"load average after {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
