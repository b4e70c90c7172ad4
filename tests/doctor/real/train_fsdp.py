"""Sharded training with FSDP2 (`fully_shard`), 1-D over the world and 2-D HSDP over a DeviceMesh, with
checkpoints through torch.distributed.checkpoint.

Run through jobs.py (the launcher). `# parted: <scenario>` marks the line where that scenario's ranks part.
DeviceMesh groups get torch's default timeout (30 min; they do not inherit init_process_group's): a hung job
here is ended by the launcher once every rank has dumped.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

BATCH = 8


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return F.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.ModuleList(Block(32) for _ in range(2))
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        h = h.view(BATCH, 2, 16).flatten(1)  # parted: fsdp_crash_midstep
        return self.head(h)  # parted: fsdp_crash_midstep


def make_model(mesh=None) -> Net:
    torch.manual_seed(0)
    model = Net()
    for module in (model.inp, *model.blocks, model.head):
        fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def load_batch(rank: int, step: int, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(batch, 16, generator=g), torch.randn(batch, 4, generator=g)


def train(ctx, model, steps: int, batch_for=None, before_step=None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        if before_step:
            before_step(step)
        x, y = batch_for(step) if batch_for else load_batch(ctx.rank, step)
        loss = F.mse_loss(model(x), y)  # parted: fsdp_loader_hang, dcp_rank0_save
        loss.backward()
        opt.step()
        opt.zero_grad()
        ctx.step_done()


def fsdp_ok(ctx) -> None:
    """Healthy control: 2 FSDP2 steps, then a checkpoint saved and loaded back with DCP."""
    model = make_model()
    train(ctx, model, steps=2)
    path = os.path.join(ctx.out, "ckpt")
    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["model"])


def fsdp_loader_hang(ctx) -> None:
    """Rank 1's data loader never returns at step 1 (a dead NFS read); the others wait in FSDP's all_gather."""
    def batch_for(step):
        if ctx.rank == 1 and step == 1:
            time.sleep(3600)  # parted: fsdp_loader_hang
        return load_batch(ctx.rank, step)

    train(ctx, make_model(), steps=3, batch_for=batch_for)


def fsdp_crash_midstep(ctx) -> None:
    """Rank 3's shard ends with a short batch (7 samples) at step 1: the forward's reshape to the configured
    batch size raises in the middle of the step, after the first units' all_gathers."""
    def batch_for(step):
        return load_batch(ctx.rank, step, batch=7 if (ctx.rank == 3 and step == 1) else BATCH)

    train(ctx, make_model(), steps=3, batch_for=batch_for)


def hsdp_ok(ctx) -> None:
    """Healthy control: HSDP over a 2x2 mesh (replicate x shard), 2 steps, a global gradient norm reduced over
    both mesh dimensions, and the loss averaged over the world."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = make_model(mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(2):
        x, y = load_batch(ctx.rank, step)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        grad_norm(model, mesh, ("shard", "replicate"))
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach())
        ctx.step_done()


def grad_norm(model, mesh, dims) -> float:
    """The global gradient norm, summed over the mesh dimensions one by one."""
    sq = sum(p.grad.to_local().pow(2).sum() for p in model.parameters())
    for dim in dims:
        dist.all_reduce(sq, group=mesh.get_group(dim))  # parted: hsdp_group_order
    return sq.sqrt().item()


def hsdp_group_order(ctx) -> None:
    """The gradient-norm reduction walks the mesh dimensions in an order taken from a set, which differs between
    processes (string hashing is randomized per process): ranks 1 and 2 reduce over 'replicate' first, ranks 0
    and 3 over 'shard' first. Mesh [[0,1],[2,3]]: 0 waits for 1, 1 for 3, 3 for 2, 2 for 0."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = make_model(mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    order = ("replicate", "shard") if ctx.rank in (1, 2) else ("shard", "replicate")  # parted: hsdp_group_order
    for step in range(2):
        x, y = load_batch(ctx.rank, step)
        F.mse_loss(model(x), y).backward()
        grad_norm(model, mesh, order)
        opt.step()
        opt.zero_grad()
        ctx.step_done()


def dcp_rank0_save(ctx) -> None:
    """`torch.save` habits: only rank 0 calls dcp.save after step 0. Its first collective (an all_gather of one
    int64) meets the others' next FSDP all_gather (36 floats): Gloo aborts rank 0 on the size mismatch."""
    model = make_model()

    def before_step(step):
        if step == 1 and ctx.rank == 0:
            state = {"model": model.state_dict()}
            dcp.save(state, checkpoint_id=os.path.join(ctx.out, "ckpt"))  # parted: dcp_rank0_save

    train(ctx, model, steps=3, before_step=before_step)


class SlowMountWriter(FileSystemWriter):
    """Stands in for a checkpoint directory on a stale NFS mount on rank 2's host: its writes never return."""

    def __init__(self, path: str, rank: int):
        super().__init__(path)
        self.rank = rank

    def write_data(self, plan, planner):
        if self.rank == 2:
            time.sleep(3600)  # parted: dcp_stuck_write
        return super().write_data(plan, planner)


def dcp_stuck_write(ctx) -> None:
    """A periodic checkpoint after step 1; rank 2's write never returns, the others wait for it in DCP."""
    model = make_model()

    def before_step(step):
        if step == 2:
            writer = SlowMountWriter(os.path.join(ctx.out, "ckpt"), ctx.rank)
            dcp.save({"model": model.state_dict()}, storage_writer=writer)  # parted: dcp_stuck_write

    train(ctx, model, steps=3, before_step=before_step)
