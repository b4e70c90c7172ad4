"""4 ranks: DDP training steps, then a manual loop (gradient all_reduce + a small metrics all_reduce per step).
With LATE_MS > 0, rank 1 sleeps that long before every step (its data loading is slow). The recorder dumps at
destroy_process_group (dump_on_exit), Flight Recorder's dump beside ours: its entries hold DDP's buckets, ours
the manual loop."""

import os
import time

import torch
import torch.distributed as dist

import distdoctor.trace as trace

trace.enable(hang_timeout=0, dump_on_exit=True)
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
late = float(os.environ.get("LATE_MS", "0")) / 1000
steps = int(os.environ.get("STEPS", "12"))

torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    if rank == 1:
        time.sleep(late)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

w = torch.randn(64, 64)
for step in range(steps):
    if rank == 1:
        time.sleep(late)
    grad = (torch.randn(8, 64) @ w).sum(0)
    dist.all_reduce(grad)  # the gradient: the slow rank arrives late here
    dist.all_reduce(grad.norm().reshape(1))  # metrics, right after a synchronizing call: nobody is late here
dist.destroy_process_group()
