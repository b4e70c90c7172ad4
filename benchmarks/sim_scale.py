"""Simulator speed: pipeline plans from 64 to 4096 ranks (DP x TP 8 x PP 8), and with micro-batches.

    python benchmarks/sim_scale.py            # the tables in docs/benchmarks.md ("Simulator speed")
    python benchmarks/sim_scale.py --quick    # smaller sweep

Times the plan generator and the simulation (compile + run + verdict) separately, single process (one
core), no detail recording (what `distdoctor sim pipeline --format json` does without picture flags).
Both CPU seconds of this process (time.process_time: what one core spends, robust on a shared machine) and
wall seconds are reported; simulated ops per second = ops executed / simulation CPU seconds.
"""

from __future__ import annotations

import argparse
import gc
import os
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
    c0, w0 = time.process_time(), time.perf_counter()
    prog = build_pipeline(cfg)
    c1, w1 = time.process_time(), time.perf_counter()
    res = simulate(prog)
    out = res.to_json()
    c2, w2 = time.process_time(), time.perf_counter()
    assert not out["deadlock"], "the benchmark plan must not deadlock"
    return {"ranks": dp * tp * pp, "dp": dp, "tp": tp, "pp": pp, "mb": mb, "ops": out["ops"],
            "gen_s": c1 - c0, "sim_s": c2 - c1, "sim_wall_s": w2 - w1, "ops_per_s": out["ops_executed"] / (c2 - c1),
            "makespan_ms": out["makespan_us"] / 1e3}


def table(rows: list[dict]) -> str:
    lines = ["| ranks | DP x TP x PP | micro-batches | ops | generate CPU s | simulate CPU s | simulate wall s "
             "| simulated ops/s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['ranks']} | {r['dp']} x {r['tp']} x {r['pp']} | {r['mb']} | {r['ops']:,} | "
                     f"{r['gen_s']:.2f} | {r['sim_s']:.2f} | {r['sim_wall_s']:.2f} | {r['ops_per_s']:,.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, one process; "
          f"load average at start {os.getloadavg()[0]:.1f}")
    dps = [1, 4, 16] if args.quick else [1, 2, 4, 8, 16, 32, 64]
    by_ranks = [measure(dp, 8, 8, 32) for dp in dps]
    print("\nRanks (TP 8 x PP 8, 32 micro-batches, 1F1B, 2 streams):\n")
    print(table(by_ranks))
    mbs = [8, 16, 32] if args.quick else [8, 16, 32, 64, 128]
    by_mb = [measure(8, 8, 8, mb) for mb in mbs]
    print("\nMicro-batches (512 ranks = DP 8 x TP 8 x PP 8):\n")
    print(table(by_mb))
    big = by_ranks[-1]
    print(f"\nTarget: {big['ranks']} ranks, 32 micro-batches simulated in {big['sim_s']:.2f} CPU s "
          f"({big['sim_wall_s']:.2f} s wall; limit 10 s; generating the plan {big['gen_s']:.2f} CPU s more). "
          f"Load average at the end {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
