"""A tiny real DDP training loop (MLP on random data) that runs until stopped: the job a node loss interrupts."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("TRAIN_TIMEOUT_S", "10"))))
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    x = torch.randn(32, 64)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        dist.all_reduce(loss.detach().clone())  # a loss average, as training loops log
    if rank == 0 and step % 20 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    time.sleep(0.02)
dist.destroy_process_group()
