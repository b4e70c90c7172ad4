"""A small training job with one ordinary fault planted, written the way users write them (knows nothing of
distdoctor). Run it under torchrun, usually under `distdoctor run`:

    distdoctor run -- python -m torch.distributed.run --nproc-per-node 4 benchmarks/hang_job.py --scenario sleep

Scenarios (the culprit is --culprit, default rank 1; the fault comes at step --at, default 5):
  sleep       a manual loop (gradient all_reduce + metrics all_reduce per step); the culprit's data loader
              never returns
  exit        the culprit leaves the loop and exits (its data ran out)
  skip        the culprit skips the metrics all_reduce on the metrics process group (new_group) once
  crash       the culprit raises in its training step
  ddp_loader  DistributedDataParallel training; the culprit's Dataset.__getitem__ never returns
  healthy     DDP training, no fault
  straggler   DDP training; the culprit sleeps --late-ms before every step
  pause       healthy DDP training that pauses every --every steps: every rank evaluates for --pause s (no
              collective), then rank 0 saves a checkpoint for --pause s while the others wait in a barrier

The culprit prints `STOP <epoch seconds>` (flushed) when its fault begins, so a benchmark reading the same
stdout can time what follows.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def stop_here(what: str) -> None:
    print(f"STOP {time.time():.3f} rank {dist.get_rank()} {what}", flush=True)


def manual_loop(args, rank: int) -> None:
    metrics = dist.new_group() if args.scenario == "skip" else None  # a separate group for logging
    w = torch.randn(256, 256)
    for step in range(args.steps):
        batch = load_batch(args, rank, step)
        if args.scenario == "exit" and rank == args.culprit and step == args.at:
            stop_here("exits: its data ran out")
            sys.exit(0)
        if args.scenario == "crash" and rank == args.culprit and step == args.at:
            stop_here("raises")
            raise ValueError(f"bad batch at step {step}")
        grad = (batch @ w).sum(0)
        dist.all_reduce(grad)
        loss = grad.norm().reshape(1)
        if args.scenario == "skip" and rank == args.culprit and step == args.at:
            stop_here("skips the metrics all_reduce")
        else:
            dist.all_reduce(loss, group=metrics)


def load_batch(args, rank: int, step: int) -> torch.Tensor:
    if args.scenario == "sleep" and rank == args.culprit and step == args.at:
        stop_here("stuck in its data loader")
        while True:
            time.sleep(3600)
    return torch.randn(32, 256)


class Data(torch.utils.data.Dataset):
    def __init__(self, args, rank: int):
        self.args, self.rank = args, rank

    def __len__(self):
        return self.args.steps * 16

    def __getitem__(self, i):
        if self.args.scenario == "ddp_loader" and self.rank == self.args.culprit and i == self.args.at * 16:
            stop_here("stuck in Dataset.__getitem__")
            while True:
                time.sleep(3600)
        return torch.randn(64), torch.randn(1)


def ddp_loop(args, rank: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Data(args, rank), batch_size=16)
    for step, (x, y) in enumerate(loader):
        if args.scenario == "straggler" and rank == args.culprit:
            time.sleep(args.late_ms / 1000)
        if args.scenario == "pause" and step and step % args.every == 0:
            time.sleep(args.pause)  # every rank evaluates: no collective in flight
            if rank == 0:
                time.sleep(args.pause)  # rank 0 saves a checkpoint while the others wait in the barrier
            dist.barrier()
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            dist.all_reduce(loss.detach())  # for logging


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", required=True,
                   choices=["sleep", "exit", "skip", "crash", "ddp_loader", "healthy", "straggler", "pause"])
    p.add_argument("--culprit", type=int, default=1)
    p.add_argument("--at", type=int, default=5)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--late-ms", type=float, default=150.0)
    p.add_argument("--pause", type=float, default=30.0)
    p.add_argument("--every", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.scenario in ("sleep", "exit", "skip", "crash"):
        manual_loop(args, rank)
    else:
        ddp_loop(args, rank)
    dist.destroy_process_group()
    if rank == 0:
        print(f"DONE {time.time():.3f}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
