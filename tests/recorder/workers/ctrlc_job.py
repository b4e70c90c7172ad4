"""Three gloo ranks with the recorder on; at step 2 rank 1 stops in its data loader (sleeps); rank 0 blocks in
the all_reduce; rank 2 waits for its async all_reduce the way a training loop that overlaps work does (polling
is_completed() and sleeping). The test then sends SIGINT to every rank (a Ctrl-C to the whole job)."""

import datetime
import os
import threading
import time

import distdoctor.recorder

distdoctor.recorder.enable(hang_timeout=2, suspect_floor=0)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

_ender = threading.Timer(90, os._exit, (3,))
_ender.daemon = True
_ender.start()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()


def load_batch(step):
    if rank == 1 and step == 2:
        while True:
            time.sleep(0.1)
    return torch.ones(4)


for step in range(4):
    batch = load_batch(step)
    if rank == 2:
        work = dist.all_reduce(batch, async_op=True)
        while not work.is_completed():
            time.sleep(0.01)
    else:
        dist.all_reduce(batch)
    print(f"STEP {step}", flush=True)
