"""2 ranks: rank 1 is stuck in a fake data loader while rank 0 waits in all_reduce; released by a file.

Both ranks also run a 'prefetcher' thread, to check that dumps carry every thread's stack, and install their
own SIGUSR1 handler (writes usr1_rank<r> next to the release file), which the recorder must chain to.
"""

import os
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import distdoctor.recorder as recorder

release = Path(sys.argv[1])
# the program's own SIGUSR1 handler, installed first: the recorder must chain to it
signal.signal(signal.SIGUSR1, lambda *_: release.with_name(f"usr1_rank{os.environ['RANK']}").touch())
recorder.enable(hang_timeout=float(os.environ.get("HANG_TIMEOUT", "2")))
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()


def prefetch_loop():
    while not release.exists():
        time.sleep(0.05)


def fetch_batch():
    while not release.exists():  # the data loader that never returns
        time.sleep(0.05)
    return torch.ones(4)


threading.Thread(target=prefetch_loop, name="prefetcher", daemon=True).start()
t = torch.ones(4)
dist.all_reduce(t)
release.with_name(f"ready_rank{rank}").touch()
batch = fetch_batch() if rank == 1 else t
dist.all_reduce(batch)
dist.destroy_process_group()
