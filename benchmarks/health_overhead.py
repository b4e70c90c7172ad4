"""HealthMonitor overhead on a small DDP training loop, side by side with the same loop without it.

    python benchmarks/health_overhead.py                 # 2 gloo ranks, the default model
    python benchmarks/health_overhead.py --hidden 64     # a toy model: the worst case (tiny steps)

Two DDP replicas of the same model live in each rank: one plain, one with a HealthMonitor at default
settings (every=50, NaN hooks on, DDP timing hook). Blocks of `--block` steps alternate between them
(B A A B ...), so machine noise hits both alike. Reported per step: wall time (the slowest rank's) and CPU
time (per rank; far steadier on a shared machine), each as the median over blocks and the median of the
per-round ratios, and the cost of one cross-rank check (the every-N gather + fingerprints).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), HERE]
# the worker processes import this file as `health_overhead` and distdoctor from this checkout
os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(HERE, "..", "src"), HERE, os.environ.get("PYTHONPATH", "")])

from distdoctor.health.monitor import HealthMonitor  # noqa: E402
from distdoctor.world import WorldConfig, run_job  # noqa: E402


def make_model(hidden: int, layers: int) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def worker(ctx, hidden: int, layers: int, batch: int, block: int, rounds: int, every: int) -> dict:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world_size))
    nets = {}
    for name in ("plain", "monitored"):
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(make_model(hidden, layers))
        nets[name] = (ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3))
    monitor = HealthMonitor(nets["monitored"][0], nets["monitored"][1], every=every)
    g = torch.Generator().manual_seed(ctx.rank)
    x, y = torch.randn(batch, hidden, generator=g), torch.randn(batch, hidden, generator=g)

    def run_block(name: str) -> tuple[float, float]:
        ddp, opt = nets[name]
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(block):
            loss = nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if name == "monitored":
                monitor.step(loss)
        # wall: the slowest rank (what the job sees); cpu: this process's CPU time, summed over ranks (what the
        # monitor costs, and far less disturbed than wall time on a shared machine)
        wall = torch.tensor([(time.perf_counter() - t0) / block], dtype=torch.float64)
        cpu = torch.tensor([(time.process_time() - c0) / block], dtype=torch.float64)
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)
        dist.all_reduce(cpu, op=dist.ReduceOp.SUM)
        return float(wall), float(cpu) / ctx.world_size

    times = {"plain": [], "monitored": []}
    with ctx.phase("warm-up"):
        run_block("plain"), run_block("monitored")
    for r in range(rounds):
        with ctx.phase(f"round {r}"):
            order = ("plain", "monitored") if r % 2 == 0 else ("monitored", "plain")
            for name in order:
                times[name].append(run_block(name))
    # the cross-rank check alone
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(5):
        monitor.check()
    check_s = (time.perf_counter() - t0) / 5
    params = sum(p.numel() for p in nets["plain"][0].parameters())
    # random targets and a small learning rate: a flat loss is a true finding here, and on a shared machine
    # a rank can truly be slowed by other jobs; replicas, NaN and memory must stay quiet
    assert {e.kind for e in monitor.events} <= {"loss_flat", "straggler"}, [e.detail for e in monitor.events]
    return {"times": times, "check_s": check_s, "params": params, "events": [e.kind for e in monitor.events]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--block", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--every", type=int, default=50)
    a = ap.parse_args()
    res = run_job("health_overhead:worker",
                  {"hidden": a.hidden, "layers": a.layers, "batch": a.batch, "block": a.block, "rounds": a.rounds,
                   "every": a.every}, WorldConfig(nproc=a.nproc, timeout_s=600))
    if not res.ok:
        sys.exit(f"benchmark failed: {res.lost} {res.errors}")
    v = res.results[0]
    cols = []
    for k in (0, 1):  # wall, cpu
        plain = statistics.median(t[k] for t in v["times"]["plain"])
        mon = statistics.median(t[k] for t in v["times"]["monitored"])
        pairs = [m[k] / p[k] for p, m in zip(v["times"]["plain"], v["times"]["monitored"])]
        cols.append(f"{plain * 1e3:.2f} / {mon * 1e3:.2f} ({100 * (statistics.median(pairs) - 1):+.2f}%)")
    print("| model | params | ranks | wall ms/step plain / monitored (overhead) | CPU ms/step per rank plain / "
          "monitored (overhead) | one check ms |")
    print("|---|---|---|---|---|---|")
    print(f"| MLP {a.layers}x{a.hidden}, batch {a.batch} | {v['params'] / 1e6:.2f} M | {a.nproc} | {cols[0]} | {cols[1]} | "
          f"{v['check_s'] * 1e3:.2f} |")


if __name__ == "__main__":
    main()
