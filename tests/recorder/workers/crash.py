"""2 ranks: rank 1 raises in its training step after one all_reduce; rank 0 is left in the next all_reduce."""

from datetime import timedelta

import torch
import torch.distributed as dist

import distdoctor.recorder as recorder

recorder.enable(hang_timeout=0)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()


def train_step(x):
    if rank == 1:
        raise ValueError("bad batch 7")
    return x * 2


t = torch.ones(4)
dist.all_reduce(t)
t = train_step(t)
dist.all_reduce(t)
