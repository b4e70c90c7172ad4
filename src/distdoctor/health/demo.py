"""A small real DDP training run with the HealthMonitor on, and optional fault injection.

    python -m distdoctor.health.demo --nproc 2 --inject nan:1:fc2 --events health.jsonl

Trains a tiny MLP (fc1 -> act1 -> fc2 -> act2 -> fc3) on a learnable synthetic classification task, each
rank on its own shard, under DDP over gloo (NCCL with one GPU per rank where there are enough GPUs). The
reporting rank prints the monitor's table (or the summary as JSON with --format json). Used by the tests
and the docs to show that each check names the right rank, layer and step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import torch
import torch.distributed as dist
import torch.nn as nn

from distdoctor.health.inject import Injector, parse_injection
from distdoctor.health.monitor import HealthMonitor


class TinyMLP(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, classes: int = 4):
        super().__init__()
        self.fc1, self.act1 = nn.Linear(d_in, hidden), nn.ReLU()
        self.fc2, self.act2 = nn.Linear(hidden, hidden), nn.ReLU()
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


def batch(step: int, rank: int, size: int, d_in: int = 16, classes: int = 4, device="cpu"):
    """A deterministic learnable batch: labels from a fixed random teacher."""
    teacher = torch.Generator().manual_seed(1234)
    w = torch.randn(d_in, classes, generator=teacher)
    g = torch.Generator().manual_seed(100_003 * step + rank)
    x = torch.randn(size, d_in, generator=g)
    return x.to(device), (x @ w).argmax(dim=1).to(device)


def run_demo(ctx, steps: int = 30, every: int = 5, inject: str | None = None, inject_step: int = 3,
             events_path: str | None = None, lr: float = 0.05, batch_size: int = 32, loss_window: int = 20,
             straggler_threshold: float = 1.5, memory_min_gap_mib: float = 256.0) -> dict:
    """Worker body: train `steps` steps with the monitor; returns the monitor's summary (same on every rank)."""
    torch.manual_seed(0)
    device = torch.device(ctx.device)
    model = TinyMLP().to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    injector = Injector(parse_injection(inject, ctx.world_size) if inject else None, ddp, ctx.rank, inject_step)
    monitor = HealthMonitor(ddp, opt, every=every, events_path=events_path, loss_window=loss_window,
                            straggler_threshold=straggler_threshold,
                            memory_min_gap_bytes=memory_min_gap_mib * 2**20)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(steps):
        x, y = batch(step, ctx.rank, batch_size, device=device)
        loss = loss_fn(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        injector.after_step()
        monitor.step(loss)
    monitor.close()
    summary = monitor.summary()
    summary["table"] = monitor.report()
    return summary


class _Ctx:
    """The per-worker facts run_demo needs, from torchrun's environment."""

    def __init__(self):
        self.rank, self.world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self.backend = "nccl" if use_cuda else "gloo"
        self.device = f"cuda:{self.local_rank}" if use_cuda else "cpu"


@click.command()
@click.option("--nproc", default=2, show_default=True, help="Worker processes (ignored under torchrun).")
@click.option("--steps", default=30, show_default=True)
@click.option("--every", default=5, show_default=True, help="Cross-rank check every N steps.")
@click.option("--inject", default=None, help="KIND:RANK[:ARG]: drift, nan, slow, mem (see distdoctor.health.inject).")
@click.option("--inject-step", default=3, show_default=True)
@click.option("--events", "events_path", default=None, help="JSON-lines events file.")
@click.option("--lr", default=0.05, show_default=True)
@click.option("--timeout", default=120, show_default=True, help="Seconds for the whole run.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
def main(nproc, steps, every, inject, inject_step, events_path, lr, timeout, fmt):
    if inject:
        parse_injection(inject, None if "RANK" in os.environ else nproc)
    if "RANK" not in os.environ:
        args, skip = [], False
        for a in sys.argv[1:]:  # torchrun would take --nproc for its own --nproc-per-node
            if not skip and not a.startswith("--nproc"):
                args.append(a)
            skip = a == "--nproc"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               "-m", "distdoctor.health.demo", *args]
        proc = subprocess.Popen(cmd, start_new_session=True)
        try:
            sys.exit(proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            sys.exit(124)
    ctx = _Ctx()
    dist.init_process_group(ctx.backend)
    try:
        summary = run_demo(ctx, steps, every, inject, inject_step, events_path, lr)
    finally:
        dist.destroy_process_group()
    if ctx.rank == 0:
        if fmt == "json":
            summary.pop("table")
            print(json.dumps(summary))
        else:
            print(summary["table"])


if __name__ == "__main__":
    main()
