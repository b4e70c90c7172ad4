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
import sys

import click
import torch
import torch.nn as nn

from distdoctor.errors import InputError
from distdoctor.health.inject import Injector, parse_injection
from distdoctor.health.monitor import HealthMonitor
from distdoctor.options import Number, count
from distdoctor.world import config_from_options, resolve_nproc, run_job, world_options


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


def run_demo(ctx, steps: int = 30, every: int = 5, inject: tuple[str, ...] = (), inject_step: int = 3,
             events_path: str | None = None, lr: float = 0.05, batch_size: int = 32, loss_window: int = 20,
             straggler_threshold: float = 1.5, memory_min_gap_mib: float = 256.0) -> dict:
    """Worker body: train `steps` steps with the monitor; returns the monitor's summary (same on every rank)."""
    torch.manual_seed(0)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world_size))  # ranks must not fight for cores
    device = torch.device(ctx.device)
    model = TinyMLP().to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    injectors = [Injector(parse_injection(spec, ctx.world_size), ddp, ctx.rank, inject_step) for spec in inject]
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
        for injector in injectors:
            injector.after_step()
        monitor.step(loss)
    monitor.close()
    summary = monitor.summary()
    summary["table"] = monitor.report()
    return summary


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@world_options
@click.option("--steps", type=count("steps", 1, 100_000), default=30, show_default=True, help="Training steps.")
@click.option("--every", type=count("steps", 1, 100_000), default=5, show_default=True,
              help="Cross-rank check every N steps.")
@click.option("--inject", multiple=True, help="KIND:RANK[:ARG]: drift, nan, slow, mem (repeatable; see "
              "distdoctor.health.inject).")
@click.option("--inject-step", type=count("steps", 0, 100_000), default=3, show_default=True,
              help="Step at which the injected faults start.")
@click.option("--events", "events_path", default=None, help="JSON-lines events file (written by rank 0).")
@click.option("--lr", type=Number("(learning rate)", 0, 1e6, low_open=True), default=0.05, show_default=True,
              help="SGD learning rate (> 0).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: the monitor's summary as one JSON document on stdout.")
def demo_command(steps, every, inject, inject_step, events_path, lr, fmt, **world):
    """Train a tiny MLP under DDP with the health monitor on; optionally inject faults."""
    # `or 2` would turn an explicit --nproc 0 into 2: only an absent --nproc takes the default.
    cfg = config_from_options(**{**world, "nproc": 2 if world["nproc"] is None else world["nproc"]})
    for spec in inject:
        parse_injection(spec, resolve_nproc(cfg))
    args = {"steps": steps, "every": every, "inject": list(inject), "inject_step": inject_step,
            "events_path": os.path.abspath(events_path) if events_path else None, "lr": lr}
    result = run_job("distdoctor.health.demo:run_demo", args, cfg)
    if not result.is_reporter:
        return
    if not result.ok:
        for lost in result.lost:
            click.echo(f"distdoctor.health.demo: {lost.describe()}", err=True)
        for rank, err in sorted(result.errors.items()):
            click.echo(f"distdoctor.health.demo: rank {rank}: {err}", err=True)
        sys.exit(1)
    summary = result.results[min(result.results)]
    table = summary.pop("table")
    click.echo(json.dumps(summary) if fmt == "json" else table)
    # Exit codes as every command's: 1 when what was watched went wrong (a NaN/inf, replicas apart).
    if any(r["first_nonfinite"] or not r["replica_ok"] for r in summary["ranks"]):
        sys.exit(1)


def main() -> None:
    try:
        demo_command.main(standalone_mode=False)
    except InputError as exc:
        click.echo(f"distdoctor.health.demo: error: {exc}", err=True)
        sys.exit(2)
    except click.UsageError as exc:
        click.echo(f"distdoctor.health.demo: error: {exc.format_message()}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
