"""Pipeline-parallel training: torch.distributed.pipelining (PipelineStage + ScheduleGPipe), two pipelines of
2 stages over a DeviceMesh, and a hand-written 2-stage pipeline with send/recv.

Run through jobs.py (the launcher). `# parted: <scenario>` marks the line where that scenario's ranks part.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

BATCH = 8
MICROBATCH = 2


def stage_module(index: int) -> nn.Module:
    torch.manual_seed(index)
    return nn.Sequential(nn.Linear(16, 16), nn.ReLU())


def loss_fn(out, target):
    return F.mse_loss(out, target)


def run_pipeline(ctx, label_batch: int = BATCH, steps: int = 2) -> None:
    """Two pipelines of 2 stages, data-parallel across them (mesh [[0, 1], [2, 3]], dims 'dp' x 'pp'), micro-
    batches of MICROBATCH samples. Each step: the schedule, the loss averaged over the world for logging, the
    gradients averaged over 'dp'. The last stage loads the labels itself, `label_batch` at a time, and counts
    its micro-batches from them."""
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "pp"))
    pp_rank, n_stages = mesh["pp"].get_local_rank(), mesh["pp"].size()
    last = pp_rank == n_stages - 1
    stage = PipelineStage(stage_module(pp_rank), pp_rank, n_stages, torch.device("cpu"), group=mesh.get_group("pp"))
    n_microbatches = (label_batch if last else BATCH) // MICROBATCH  # parted: pp_microbatches
    schedule = ScheduleGPipe(stage, n_microbatches=n_microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(stage.submod.parameters(), lr=0.05)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * mesh["dp"].get_local_rank() + step)
        x, target = torch.randn(BATCH, 16, generator=g), torch.randn(label_batch, 16, generator=g)
        losses: list = []
        if pp_rank == 0:
            schedule.step(x)  # parted: pp_microbatches
        else:
            schedule.step(target=target, losses=losses)  # parted: pp_microbatches
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros(())
        dist.all_reduce(loss)  # parted: pp_microbatches
        for p in stage.submod.parameters():
            dist.all_reduce(p.grad, group=mesh.get_group("dp"))
        opt.step()
        opt.zero_grad()
        ctx.step_done()


def pp_ok(ctx) -> None:
    """Healthy control: GPipe, 4 micro-batches of 2 on every stage of both pipelines."""
    run_pipeline(ctx)


def pp_microbatches(ctx) -> None:
    """A config that differs per rank: rank 3's label loader (the last stage of the second pipeline) has batch
    size 4, so it runs 2 micro-batches where its first stage, rank 2, runs 4. Gloo's send waits for the matching
    receive: rank 2 is stuck sending micro-batch 2 forward while rank 3 is stuck sending the gradient of
    micro-batch 0 back. The first pipeline (ranks 0, 1) waits in the loss all_reduce."""
    run_pipeline(ctx, label_batch=4 if ctx.rank == 3 else BATCH)


def p2p_both_recv(ctx) -> None:
    """Two hand-written 2-stage pipelines, ranks (0, 1) and (2, 3), data-parallel across; each step the first
    stage sends its activations and receives their gradient, the second receives, computes the loss and sends
    the gradient back; the loss is then averaged over the world. Rank 2 computes its stage as rank // 2 (1)
    instead of rank % 2 (0): it receives first from rank 3, which also receives first."""
    stage = ctx.rank // 2 if ctx.rank == 2 else ctx.rank % 2  # parted: p2p_both_recv
    peer = ctx.rank + 1 if ctx.rank % 2 == 0 else ctx.rank - 1
    torch.manual_seed(stage)
    layer = nn.Linear(16, 16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    for step in range(2):
        g = torch.Generator().manual_seed(100 * (ctx.rank // 2) + step)
        x, target = torch.randn(BATCH, 16, generator=g), torch.randn(BATCH, 16, generator=g)
        if stage == 0:
            act = layer(x)
            dist.send(act.detach(), dst=peer)
            grad = torch.empty_like(act)
            dist.recv(grad, src=peer)
            act.backward(grad)
            loss = torch.zeros(())
        else:
            act_in = torch.empty(BATCH, 16)
            dist.recv(act_in, src=peer)  # parted: p2p_both_recv
            act_in.requires_grad_()
            loss = F.mse_loss(layer(act_in), target)
            loss.backward()
            dist.send(act_in.grad, dst=peer)
        opt.step()
        opt.zero_grad()
        dist.all_reduce(loss.detach())  # parted: p2p_both_recv
        ctx.step_done()
