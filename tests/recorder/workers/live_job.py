"""A recorded loop of all_reduces (recorder.enable(), no distdoctor run) in which rank 1 stops at step 10."""

import datetime
import os
import time

import distdoctor.recorder

distdoctor.recorder.enable(dump_dir=os.environ["DUMP_DIR"], hang_timeout=60, suspect_floor=2)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def wait_for_the_next_batch():
    time.sleep(600)


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
t = torch.ones(8)
for step in range(100_000):
    if step == int(os.environ.get("STOP_STEP", "10")) and rank == 1:
        print("STOP", flush=True)
        wait_for_the_next_batch()
    dist.all_reduce(t)
    time.sleep(0.02)
