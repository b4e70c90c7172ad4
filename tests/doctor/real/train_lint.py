"""A small data-parallel training job over a 2x2 DeviceMesh that completes on Gloo yet carries the latent
deadlock hazards `distdoctor lint` finds (`lint_hazards`), and its fixed twin (`lint_fixed`).

Run through jobs.py (the launcher). `# hazard: <kind>` marks the line where the ranks part in `lint_hazards`
(tests/doctor/real/test_lint_real.py expects it among the hazard's call sites):
- group_creation_order: two world-spanning groups (metrics, checkpoint) created in an order taken from a
  per-rank config (ranks 2 and 3 list them the other way round); torch numbers groups in creation order, so
  group '1' is the metrics group on ranks 0-1 and the checkpoint group on ranks 2-3 (unused here: it works);
- order_inversion: the loss is averaged over the world and the gradient norm over the mesh's 'dp' dimension,
  both async, issued in a per-rank order (ranks 2 and 3 reduce the norm first): Gloo runs each group on its
  own thread and completes; blocking calls or one device stream deadlock;
- rank_conditional_collective: rank 0 averages the loss in its logging helper, the others in the training
  helper: the same all_reduce today, from two code paths;
- p2p_order: a ring exchange of a halo tensor (send to the next rank, receive from the previous one) with an
  unbatched isend before the recv: Gloo runs the isend on its own thread; NCCL above its eager size deadlocks.
The twin does the same work with one order, one code path and a batched exchange.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

STEPS = 2


def make_groups(ctx, fixed: bool) -> dict:
    names = ("metrics", "checkpoint") if fixed or ctx.rank < 2 else ("checkpoint", "metrics")
    groups = {}
    for name in names:
        groups[name] = dist.new_group(list(range(ctx.world)), timeout=ctx.pg_timeout, group_desc=name)  # hazard: group_creation_order
    return groups


def log_loss(loss: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(loss)  # hazard: rank_conditional_collective
    return loss / dist.get_world_size()


def average_loss(loss: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(loss)  # hazard: rank_conditional_collective
    return loss / dist.get_world_size()


def reduce_stats(loss, sq, mesh, world_first: bool) -> None:
    """The loss over the world and the squared gradient norm over 'dp', both async, in the given order."""
    works = []
    for which in (("world", "dp") if world_first else ("dp", "world")):
        if which == "world":
            works.append(dist.all_reduce(loss, async_op=True))  # hazard: order_inversion
        else:
            works.append(dist.all_reduce(sq, group=mesh.get_group("dp"), async_op=True))  # hazard: order_inversion
    for w in works:
        w.wait()


def halo_exchange(ctx, fixed: bool) -> torch.Tensor:
    nxt, prev = (ctx.rank + 1) % ctx.world, (ctx.rank - 1) % ctx.world
    out, got = torch.full((4,), float(ctx.rank)), torch.empty(4)
    if fixed:
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prev)]):
            w.wait()
        return got
    work = dist.isend(out, nxt)  # hazard: p2p_order
    dist.recv(got, prev)
    work.wait()
    return got


def _train(ctx, fixed: bool) -> None:
    make_groups(ctx, fixed)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(ctx.rank)
    for _ in range(STEPS):
        x, y = torch.randn(4, 8, generator=g), torch.randn(4, 2, generator=g)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= ctx.world
        opt.step()
        opt.zero_grad()
        sq = sum(p.detach().pow(2).sum() for p in model.parameters())
        reduce_stats(loss.detach(), sq, mesh, world_first=fixed or ctx.rank < 2)
        if ctx.rank == 0 and not fixed:
            log_loss(loss.detach())
        else:
            average_loss(loss.detach())
        halo_exchange(ctx, fixed)
        ctx.step_done()


def lint_hazards(ctx) -> None:
    _train(ctx, fixed=False)


def lint_fixed(ctx) -> None:
    _train(ctx, fixed=True)
