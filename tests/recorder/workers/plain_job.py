"""A training script that knows nothing of distdoctor (run under `distdoctor run`).

Usage: plain_job.py single PORT   -- one process, world size 1; a loader thread dies, exit code 3
       plain_job.py torchrun      -- under torchrun: rank 1 is stuck in its data loader until RELEASE_FILE exists
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist


def load_next_batch():
    """Stuck until RELEASE_FILE exists (at most 60 s)."""
    deadline = time.monotonic() + 60
    while not os.path.exists(os.environ["RELEASE_FILE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return torch.ones(2)


def loader():
    raise RuntimeError("loader died")


if sys.argv[1] == "single":
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[2]}", rank=0, world_size=1)
    dist.all_reduce(torch.ones(2))
    th = threading.Thread(target=loader, name="loader")
    th.start()
    th.join()
    dist.destroy_process_group()
    sys.exit(3)
else:
    dist.init_process_group("gloo")
    t = torch.ones(2)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        t = load_next_batch()
    dist.all_reduce(t)
    dist.destroy_process_group()
