"""Does the bench harness distort what it measures? distdoctor bench vs a bare torch.distributed loop.

In ONE world (same processes, same process group), for all_reduce float32 at 1, 4 and 16 MiB, each round
times the size twice: once through `distdoctor.bench.bench_worker` (the code `distdoctor bench` runs: spec
buffers, warmup, barrier, timed loop of the spec's call) and once with a bare loop written here
(`dist.all_reduce(t)` on a plain tensor, barrier, perf_counter), and once more with a second bare loop (the
bare-vs-bare ratio is the machine's noise floor). The three take every position in turn (all 6 orders), so
drift on a shared machine hits them alike. Per round and size the time is the max over ranks (as bench reports);
busbw uses nccl-tests' factor 2(n-1)/n. Reported: the median busbw of each over the rounds and the ratio
harness / bare, as the median over rounds of each round's paired ratio (target: within 5%).

    python benchmarks/bench_vs_bare.py [--nproc 4] [--rounds 5] [--iters 20] [--warmup 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

SIZES = [1 << 20, 4 << 20, 16 << 20]
_ORDERS = list(itertools.permutations(("harness", "bare", "bare_again")))


def bare_time(count: int, iters: int, warmup: int) -> float:
    import torch
    import torch.distributed as dist

    t = torch.ones(count, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t)
    return (time.perf_counter() - t0) / iters


def worker(ctx, sizes, rounds, iters, warmup):
    from distdoctor.bench.sweep import bench_worker, count_for

    out = []
    for rnd in range(rounds):
        for size in sizes:
            count = count_for("all_reduce", size, "float32", ctx.world_size)
            # "bare_again" is a second bare loop: the bare-vs-bare (A/A) ratio is the noise floor of the machine
            # every arm takes every position equally often (the 6 orders in turn): no position bias
            order = _ORDERS[rnd % len(_ORDERS)]
            for which in order:
                if which == "harness":
                    res = bench_worker(ctx, op="all_reduce", dtype="float32", redop="sum", root=0, sizes=[size],
                                       iters=iters, warmup=warmup, check=False)
                    seconds = res["rows"][0]["time_s"]
                else:
                    seconds = bare_time(count, iters, warmup)
                out.append({"round": rnd, "size": size, "which": which, "time_s": seconds})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()

    from distdoctor.collectives import bus_factor
    from distdoctor.world import WorldConfig, run_job

    started = time.time()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    job = run_job("bench_vs_bare:worker", {"sizes": SIZES, "rounds": args.rounds, "iters": args.iters,
                                           "warmup": args.warmup}, WorldConfig(nproc=args.nproc, timeout_s=300))
    if not job.ok:
        sys.exit(f"the world failed: {[lr.describe() for lr in job.lost]} {job.errors}")
    n = job.world_size
    # (size, which, round) -> max over ranks
    slowest: dict[tuple, float] = {}
    for rank_rows in job.results.values():
        for r in rank_rows:
            key = (r["size"], r["which"], r["round"])
            slowest[key] = max(slowest.get(key, 0.0), r["time_s"])
    table = []
    for size in SIZES:
        med = {}
        for which in ("harness", "bare", "bare_again"):
            busbw = [size / slowest[(size, which, rnd)] / 1e9 * bus_factor("all_reduce", n)
                     for rnd in range(args.rounds)]
            med[which] = statistics.median(busbw)
        # paired: the two timings of one round ran back to back, so their ratio cancels most machine drift
        paired = statistics.median(slowest[(size, "bare", rnd)] / slowest[(size, "harness", rnd)]
                                   for rnd in range(args.rounds))
        best = {w: min(slowest[(size, w, rnd)] for rnd in range(args.rounds)) for w in ("harness", "bare", "bare_again")}
        noise = statistics.median(slowest[(size, "bare", rnd)] / slowest[(size, "bare_again", rnd)]
                                  for rnd in range(args.rounds))
        # 95% confidence interval of the median paired ratio (order statistics, binomial approximation)
        ratios = sorted(slowest[(size, "bare", rnd)] / slowest[(size, "harness", rnd)] for rnd in range(args.rounds))
        half = 0.98 * args.rounds ** 0.5
        lo, hi = max(0, int(args.rounds / 2 - half)), min(args.rounds - 1, int(args.rounds / 2 + half))
        ci = (ratios[lo], ratios[hi])
        table.append({"size_bytes": size, "harness_busbw_gbps": med["harness"], "bare_busbw_gbps": med["bare"],
                      "ratio": paired, "ratio_of_medians": med["harness"] / med["bare"], "bare_vs_bare": noise,
                      "ratio_ci95": ci, "best_ratio": best["bare"] / best["harness"], "best_bare_vs_bare": best["bare"] / best["bare_again"]})
    result = {"world_size": n, "backend": job.backend, "rounds": args.rounds, "iters": args.iters,
              "warmup": args.warmup, "rows": table, "wall_s": round(time.time() - started, 1),
              "worst_deviation": max(abs(1 - row["ratio"]) for row in table),
              "worst_best_deviation": max(abs(1 - row["best_ratio"]) for row in table),
              "noise_floor": max(abs(1 - row["bare_vs_bare"]) for row in table), "load_before": load_before}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"all_reduce float32, {n} ranks over {job.backend}, {args.rounds} interleaved rounds x {args.iters} iters "
          f"(median busbw over rounds; time = max over ranks)")
    print("busbw: median over rounds; ratios (harness busbw / bare busbw): median of per-round paired ratios, and")
    print("best-of-rounds (the least disturbed round of each); bare/bare is the same ratio for two bare loops = noise")
    print(f"{'size':>10}  {'harness GB/s':>12}  {'bare GB/s':>10}  {'paired':>7}  {'95% CI':>13}  {'best':>6}  "
          f"{'noise paired':>12}  {'noise best':>10}")
    for row in table:
        print(f"{row['size_bytes'] >> 20:>7} MiB  {row['harness_busbw_gbps']:12.3f}  {row['bare_busbw_gbps']:10.3f}  "
              f"{row['ratio']:7.3f}  {row['ratio_ci95'][0]:6.3f}-{row['ratio_ci95'][1]:6.3f}  {row['best_ratio']:6.3f}  "
              f"{row['bare_vs_bare']:12.3f}  {row['best_bare_vs_bare']:10.3f}")
    print(f"worst deviation: paired {result['worst_deviation']:.1%}, best-of-rounds {result['worst_best_deviation']:.1%} "
          f"(target <= 5%); noise floor (worst paired bare/bare) "
          f"{result['noise_floor']:.1%}; wall {result['wall_s']} s; load average before {result['load_before']}")


if __name__ == "__main__":
    main()
