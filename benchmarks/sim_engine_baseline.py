"""Simulator engine against a baseline checkout, side by side: simulate CPU seconds of one pipeline plan.

    git archive <commit> src | tar -x -C /tmp/base
    python benchmarks/sim_engine_baseline.py --baseline /tmp/base/src [--dp 16] [--rounds 2] [--deadlock]

Alternates the baseline's `src/` and this checkout's in fresh processes (`rounds` times each), each timing the
best of 3 `simulate(prog).to_json()` on the same plan (1F1B, TP 8 x PP 8, 32 micro-batches, DP `--dp`) with
time.process_time, so load on a shared machine hits both alike; prints both and the ratio. `--deadlock`: the
same plan with the input gradient received on the forward stream (example (a)'s hang on every stage-0 rank), so
the time includes the wait-for analysis and the findings of a deadlocked run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"
CHILD = """
import gc, sys, time
sys.path.insert(0, sys.argv[1])
from distdoctor.sim.plans.pipeline import PipelineConfig, build_pipeline
from distdoctor.sim.result import simulate
prog = build_pipeline(PipelineConfig(stages=8, microbatches=32, dp=int(sys.argv[2]), tp=8,
                                     grad_recv_stream=sys.argv[3]))
best = float("inf")
for _ in range(3):
    gc.collect()
    c = time.process_time()
    out = simulate(prog).to_json()
    best = min(best, time.process_time() - c)
print(out["ops"], best)
"""


def run(src: Path, dp: int, stream: str) -> tuple[int, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(src), str(dp), stream], capture_output=True, text=True,
                         check=True, timeout=600).stdout.split()
    return int(out[0]), float(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, type=Path, help="the baseline checkout's src/ directory")
    ap.add_argument("--dp", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--deadlock", action="store_true", help="a plan that deadlocks (times the wait-for analysis)")
    args = ap.parse_args()
    stream = "fwd" if args.deadlock else "bwd"
    base, this = [], []
    for _ in range(args.rounds):
        ops, t = run(args.baseline, args.dp, stream)
        base.append(t)
        _, t = run(HERE, args.dp, stream)
        this.append(t)
    print(f"plan: DP {args.dp} x TP 8 x PP 8, 32 micro-batches, {ops:,} ops{', deadlocks' if args.deadlock else ''}; "
          f"best-of-3 simulate CPU s per round")
    print(f"baseline: {', '.join(f'{t:.3f}' for t in base)}")
    print(f"this:     {', '.join(f'{t:.3f}' for t in this)}")
    print(f"ratio this/baseline (min over rounds): {min(this) / min(base):.3f}")


if __name__ == "__main__":
    main()
