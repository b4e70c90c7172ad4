"""A job that only calls torch's own start_debug_server (no distdoctor anywhere); rank 2 stops at step 10."""

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.debug import start_debug_server


def wait_for_the_next_batch():
    time.sleep(600)


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
start_debug_server(port=int(os.environ["FRONTEND_PORT"]))
rank = dist.get_rank()
t = torch.ones(8)
for step in range(100_000):
    if step == 10 and rank == 2:
        print("STOP", flush=True)
        wait_for_the_next_batch()
    dist.all_reduce(t)
    time.sleep(0.02)
