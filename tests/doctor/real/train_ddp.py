"""Data-parallel training with DistributedDataParallel, and the object collectives around it.

Run through jobs.py (the launcher). `# parted: <scenario>` marks the line where that scenario's ranks part.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def load_batch(rank: int, step: int, batch: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g)


def train_step(model, opt, x, y) -> torch.Tensor:
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def log_loss(loss: torch.Tensor, world: int, group=None) -> float:
    total = loss.clone()
    dist.all_reduce(total, group=group)  # parted: ddp_straggler
    return total.item() / world


def ddp_ok(ctx) -> None:
    """Healthy control: the config comes from rank 0 (broadcast_object_list), 3 DDP steps with the loss logged,
    and per-rank stats gathered at the end (all_gather_object)."""
    config = [{"lr": 0.05, "steps": 3}] if ctx.rank == 0 else [None]
    dist.broadcast_object_list(config, src=0)
    cfg = config[0]
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    for step in range(cfg["steps"]):
        x, y = load_batch(ctx.rank, step)
        log_loss(train_step(model, opt, x, y), ctx.world)
        ctx.step_done()
    stats = [None] * ctx.world
    dist.all_gather_object(stats, {"rank": ctx.rank, "steps": cfg["steps"]})
    assert [s["rank"] for s in stats] == list(range(ctx.world))


def ddp_crash(ctx) -> None:
    """Rank 1 meets a corrupt sample at step 1 and raises; the others wait for it in DDP's next collective."""
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        x, y = load_batch(ctx.rank, step)
        if ctx.rank == 1 and step == 1:
            raise ValueError("corrupt sample 1377 in shard 1: expected 16 features")  # parted: ddp_crash
        loss = F.mse_loss(model(x), y)  # parted: ddp_crash
        loss.backward()  # parted: ddp_crash
        opt.step()
        opt.zero_grad()
        log_loss(loss.detach(), ctx.world)
        ctx.step_done()


def ddp_metric_dtype(ctx) -> None:
    """A config that differs per rank: rank 2's metrics counters are int32, the others' float32. Same bytes, so
    Gloo reduces them without complaint (into garbage); no hang, a wrong number in the logs."""
    metrics_dtype = torch.int32 if ctx.rank == 2 else torch.float32  # rank 2 read an old config file
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        x, y = load_batch(ctx.rank, step)
        loss = train_step(model, opt, x, y)
        counts = torch.tensor([float(loss < 1.0), 1.0]).to(metrics_dtype)
        dist.all_reduce(counts)  # parted: ddp_metric_dtype
        ctx.step_done()


def ddp_straggler(ctx) -> None:
    """Rank 3's data loading takes 150 ms longer per step (a slow disk): it arrives late at every gradient
    all_reduce, then the loss all_reduce of the same step finds everyone in step. No hang."""
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(8):
        if ctx.rank == 3:
            time.sleep(0.15)  # parted: ddp_straggler
        x, y = load_batch(ctx.rank, step)
        loss = F.mse_loss(model(x), y)
        loss.backward()  # parted: ddp_straggler
        opt.step()
        opt.zero_grad()
        log_loss(loss.detach(), ctx.world)
        ctx.step_done()


def metrics_group_alone(ctx) -> None:
    """A metrics group made with new_group, used for logging; the logging runs on rank 0 only, so rank 0 sits
    alone in the group's first all_reduce while the others go on into DDP's next step and wait for rank 0."""
    metrics = dist.new_group(timeout=ctx.pg_timeout, group_desc="metrics")
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        x, y = load_batch(ctx.rank, step)
        loss = train_step(model, opt, x, y)  # parted: metrics_group_alone
        if ctx.rank == 0:  # "only rank 0 logs"
            dist.all_reduce(loss, group=metrics)  # parted: metrics_group_alone
        ctx.step_done()


def object_root(ctx) -> None:
    """The run config is broadcast from the 'leader' rank; rank 3's launcher environment names rank 2 as the
    leader, the others rank 0: a root disagreement inside broadcast_object_list."""
    leader = 2 if ctx.rank == 3 else 0
    config = [{"lr": 0.05, "steps": 3}] if ctx.rank == leader else [None]
    dist.broadcast_object_list(config, src=leader)  # parted: object_root
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=config[0]["lr"])
    for step in range(config[0]["steps"]):
        x, y = load_batch(ctx.rank, step)
        log_loss(train_step(model, opt, x, y), ctx.world)
        ctx.step_done()
