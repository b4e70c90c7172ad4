"""Real training programs, written as users write them with torch's own parallel libraries, for the real-job
fuzzer (fuzz/run_jobs.py). Run one under torchrun: `torchrun --nproc-per-node 4 fuzz/jobs.py PROGRAM [STEPS]`.

Each program trains a small model for STEPS steps (an optimizer step each, so `--inject ...@step=N` has steps to
count) and does what such jobs do at the Python level too (a loss all_reduce for the log line, a checkpoint).
Programs: ddp (gradient buckets, no_sync accumulation, find_unused_parameters), fsdp (FSDP2 fully_shard on a 1-D
mesh), hsdp (fully_shard on a 2-D (replicate, shard) mesh), tp (parallelize_module on a 2-D (dp, tp) mesh),
pipeline (torch.distributed.pipelining, GPipe or 1F1B), moe (all_to_all_single with split sizes), dcp
(distributed checkpoint save and load), objects (all_gather_object, broadcast_object_list).
"""

from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
# DDP's constructor and an optimizer's first step import torch._dynamo (some 800 modules). Imported here, before the
# process group exists, a rank slow to import it on a loaded machine is slow to start, not a rank that its peers
# wait for inside a collective for longer than `distdoctor run --hang-timeout` allows.
import torch._dynamo  # noqa: F401,E402

STEP_PAUSE = float(os.environ.get("FUZZ_STEP_PAUSE", "0.05"))


class MLP(nn.Module):
    def __init__(self, dim: int = 16, unused: bool = False):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.aux = nn.Linear(dim, dim) if unused else None  # a branch some steps skip

    def forward(self, x, use_aux: bool = False):
        y = self.fc2(F.relu(self.fc1(x)))
        return self.aux(y) if use_aux and self.aux is not None else y


def log_loss(loss: torch.Tensor, step: int, group=None) -> None:
    """The mean loss over the job, on rank 0's log line."""
    t = loss.detach().clone()
    dist.all_reduce(t, group=group)
    if dist.get_rank() == 0 and step % 2 == 0:
        print(f"step {step} loss {t.item() / dist.get_world_size(group):.4f}", flush=True)


def pause() -> None:
    import time

    time.sleep(STEP_PAUSE)


def ddp(steps: int) -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(MLP(unused=True), bucket_cap_mb=0.001, find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        for micro in range(2):  # gradient accumulation: no all_reduce on the first micro-batch
            x = torch.randn(8, 16)
            if micro == 0:
                with model.no_sync():
                    model(x, use_aux=step % 2 == 0).pow(2).mean().backward()
            else:
                loss = model(x, use_aux=step % 2 == 0).pow(2).mean()
                loss.backward()
        opt.step()
        opt.zero_grad()
        log_loss(loss, step)
        pause()


def _fsdp(steps: int, mesh) -> None:
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(MLP(), MLP())
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        log_loss(loss, step)
        pause()


def fsdp(steps: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    _fsdp(steps, init_device_mesh("cpu", (dist.get_world_size(),)))


def hsdp(steps: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    _fsdp(steps, init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard")))


def tp(steps: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world = dist.get_world_size()
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(MLP(), mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dp = mesh["dp"].get_group()
    for step in range(steps):
        torch.manual_seed(100 + step * 7 + mesh["dp"].get_local_rank())
        loss = model(torch.randn(4, 16)).pow(2).mean()
        loss.backward()
        for p in model.parameters():  # data parallel by hand over the dp dimension
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(grad, group=dp)
        opt.step()
        opt.zero_grad()
        log_loss(loss, step, group=dp)
        pause()


def pipeline(steps: int) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    stage_mod = MLP()
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    last = rank == world - 1
    schedule_cls = Schedule1F1B if os.environ.get("FUZZ_SCHEDULE") == "1f1b" else ScheduleGPipe
    schedule = schedule_cls(stage, n_microbatches=4, loss_fn=(lambda out, tgt: (out - tgt).pow(2).mean()))
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.01)
    for step in range(steps):
        torch.manual_seed(step)
        x, target = torch.randn(8, 16), torch.randn(8, 16)
        if rank == 0:
            schedule.step(x)
        elif last:
            losses: list = []
            schedule.step(target=target, losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()
        pause()


def moe(steps: int) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    experts = nn.Linear(16, 16)  # this rank's expert
    router = nn.Linear(16, world)
    opt = torch.optim.SGD([*experts.parameters(), *router.parameters()], lr=0.01)
    for step in range(steps):
        torch.manual_seed(step * 31 + rank)
        x = torch.randn(12, 16)
        with torch.no_grad():
            dest = router(x).argmax(dim=1)
        order = torch.argsort(dest)
        send_counts = torch.bincount(dest, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)  # how many tokens each rank sends me
        tokens = x[order]
        received = torch.empty(int(recv_counts.sum()), 16)
        dist.all_to_all_single(received, tokens, recv_counts.tolist(), send_counts.tolist())
        out = experts(received)
        back = torch.empty_like(tokens)
        dist.all_to_all_single(back, out.detach(), send_counts.tolist(), recv_counts.tolist())
        loss = out.pow(2).mean() + router(x).pow(2).mean()
        loss.backward()
        for p in router.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        log_loss(loss, step)
        pause()


def dcp(steps: int) -> None:
    import torch.distributed.checkpoint as dcp_api
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(MLP())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    where = [os.environ.get("FUZZ_CKPT") or tempfile.mkdtemp(prefix="fuzzckpt")] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(where, src=0)
    last = None
    for step in range(steps):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 2 == 1:
            last = os.path.join(where[0], f"step{step}")
            dcp_api.save({"model": model.state_dict()}, checkpoint_id=last)
        pause()
    if last is not None:
        state = {"model": model.state_dict()}
        dcp_api.load(state, checkpoint_id=last)  # resume as a restarted job would


def objects(steps: int) -> None:
    rank = dist.get_rank()
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(steps):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        stats: list = [None] * dist.get_world_size()
        dist.all_gather_object(stats, {"rank": rank, "loss": float(loss)})
        config = [{"lr": 0.01, "step": step}] if rank == 0 else [None]
        dist.broadcast_object_list(config, src=0)
        pause()


PROGRAMS = {f.__name__: f for f in (ddp, fsdp, hsdp, tp, pipeline, moe, dcp, objects)}


def main() -> None:
    name = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    dist.init_process_group("gloo")
    torch.manual_seed(1234)
    PROGRAMS[name](steps)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
