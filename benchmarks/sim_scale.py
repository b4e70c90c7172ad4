"""Simulator speed: pipeline plans from 64 to 4096 ranks (DP x TP 8 x PP 8), and with micro-batches.

    python benchmarks/sim_scale.py            # the tables in docs/benchmarks.md ("Simulator speed")
    python benchmarks/sim_scale.py --quick    # smaller sweep
    python benchmarks/sim_scale.py --target   # only the 16 384-rank figure (DP 256 x TP 8 x PP 8, 32 micro-batches)

Times the plan generator and the simulation (compile + run + verdict) separately, single process (one
core), no detail recording (what `distdoctor sim pipeline --format json` does without picture flags).
Both CPU seconds of this process (time.process_time: what one core spends, robust on a shared machine) and
wall seconds are reported; simulated ops per second = ops executed / simulation CPU seconds.

The 16 384-rank figure (issue 15: <= 20 s, <= 4 GB) runs in fresh processes so that each has its own peak RSS:
once in-process as above (generate, simulate, per op: CPU microseconds and peak bytes), and once as the command
a user types, `distdoctor sim pipeline ... --format json` (wall, peak RSS of that process).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
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


TARGET = {"dp": 256, "tp": 8, "pp": 8, "mb": 32}
CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
from sim_scale import measure
row = measure(*map(int, sys.argv[3:7]))
row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(row))
"""


def target() -> tuple[dict, dict]:
    """The 16 384-rank plan in a fresh process, then through the CLI in another: (in-process row, CLI row)."""
    here = Path(__file__).resolve().parent
    src = here.parent / "src"
    t = TARGET
    out = subprocess.run([sys.executable, "-c", CHILD, str(src), str(here), str(t["dp"]), str(t["tp"]),
                          str(t["pp"]), str(t["mb"])], capture_output=True, text=True, check=True, timeout=900)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    cmd = [sys.executable, "-m", "distdoctor", "sim", "pipeline", "--stages", str(t["pp"]), "--dp", str(t["dp"]),
           "--tp", str(t["tp"]), "--microbatches", str(t["mb"]), "--format", "json"]
    env = {**os.environ, "PYTHONPATH": str(src)}
    w0 = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter() - w0
    report = json.loads(proc.stdout)
    assert proc.returncode == 0 and not report["deadlock"], proc.stderr[-2000:]
    cli = {"wall_s": wall, "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
           "peak_rss_bytes": after.ru_maxrss * 1024, "ops": report["ops"], "json_bytes": len(proc.stdout),
           "command": "distdoctor " + " ".join(cmd[3:])}
    return row, cli


def target_lines(row: dict, cli: dict) -> list[str]:
    ops = row["ops"]
    return [
        f"Target: {row['ranks']} ranks (DP {row['dp']} x TP {row['tp']} x PP {row['pp']}, {row['mb']} micro-batches), "
        f"{ops:,} ops; limit 20 s, 4 GB.",
        f"  in-process: generate {row['gen_s']:.2f} CPU s + simulate {row['sim_s']:.2f} CPU s "
        f"(= {row['gen_s'] + row['sim_s']:.2f}; simulate wall {row['sim_wall_s']:.2f} s), "
        f"peak RSS {row['peak_rss_bytes'] / 2**30:.2f} GiB",
        f"  per op: {(row['gen_s'] + row['sim_s']) / ops * 1e6:.2f} CPU us (simulate alone "
        f"{row['sim_s'] / ops * 1e6:.2f}), {row['peak_rss_bytes'] / ops:.0f} bytes of peak RSS",
        f"  `{cli['command']}`: {cli['wall_s']:.2f} s wall, {cli['cpu_s']:.2f} CPU s, "
        f"peak RSS {cli['peak_rss_bytes'] / 2**30:.2f} GiB ({cli['peak_rss_bytes'] / cli['ops']:.0f} bytes per op), "
        f"{cli['json_bytes'] / 2**20:.1f} MiB of JSON",
    ]


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
    ap.add_argument("--target", action="store_true", help="only the 16 384-rank figure")
    args = ap.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, one process; "
          f"load average at start {os.getloadavg()[0]:.1f}")
    if args.target:
        print("\n".join(target_lines(*target())))
        print(f"Load average at the end {os.getloadavg()[0]:.1f}.")
        return
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
          f"({big['sim_wall_s']:.2f} s wall; limit 10 s; generating the plan {big['gen_s']:.2f} CPU s more).")
    if not args.quick:
        print("\n".join(target_lines(*target())))
    print(f"Load average at the end {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
