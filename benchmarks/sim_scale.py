"""Simulator speed: pipeline plans from 64 to 4096 ranks (DP x TP 8 x PP 8), and with micro-batches.

    python benchmarks/sim_scale.py            # the tables in docs/benchmarks.md ("Simulator speed")
    python benchmarks/sim_scale.py --quick    # smaller sweep

Times the plan generator and the simulation (compile + run + verdict) separately, single process (one
core), no detail recording (what `distdoctor sim pipeline --format json` does without picture flags).
Reports simulated ops per second = ops executed / simulation seconds.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from distdoctor.sim.plans.pipeline import PipelineConfig, build_pipeline  # noqa: E402
from distdoctor.sim.result import simulate  # noqa: E402


def measure(dp: int, tp: int, pp: int, mb: int, schedule: str = "1f1b") -> dict:
    cfg = PipelineConfig(stages=pp, microbatches=mb, dp=dp, tp=tp, schedule=schedule)
    gc.collect()
    t0 = time.perf_counter()
    prog = build_pipeline(cfg)
    t1 = time.perf_counter()
    res = simulate(prog)
    t2 = time.perf_counter()
    out = res.to_json()
    assert not out["deadlock"], "the benchmark plan must not deadlock"
    return {"ranks": dp * tp * pp, "dp": dp, "tp": tp, "pp": pp, "mb": mb, "ops": out["ops"],
            "gen_s": t1 - t0, "sim_s": t2 - t1, "ops_per_s": out["ops_executed"] / (t2 - t1),
            "makespan_ms": out["makespan_us"] / 1e3}


def table(rows: list[dict]) -> str:
    lines = ["| ranks | DP x TP x PP | micro-batches | ops | generate (s) | simulate (s) | simulated ops/s |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['dp']} x {r['tp']} x {r['pp']} | {r['mb']} | {r['ops']:,} | "
                     f"{r['gen_s']:.2f} | {r['sim_s']:.2f} | {r['ops_per_s']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, one process")
    dps = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32, 64]
    by_ranks = [measure(dp, 8, 8, 32) for dp in dps]
    print("\nRanks (TP 8 x PP 8, 32 micro-batches, 1F1B, 2 streams):\n")
    print(table(by_ranks))
    mbs = [8, 16, 32] if args.quick else [8, 16, 32, 64, 128]
    by_mb = [measure(8, 8, 8, mb) for mb in mbs]
    print("\nMicro-batches (512 ranks = DP 8 x TP 8 x PP 8):\n")
    print(table(by_mb))
    big = by_ranks[-1]
    print(f"\nTarget: {big['ranks']} ranks, 32 micro-batches simulated in {big['sim_s']:.2f} s "
          f"(limit 10 s; generation {big['gen_s']:.2f} s more).")


if __name__ == "__main__":
    main()
