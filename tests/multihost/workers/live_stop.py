"""A loop of small all_reduces in which one rank stops: `sleep` (outside any collective, its Python idle) or
`gil` (inside a C call that holds the GIL, so no Python thread of that rank can run)."""

import ctypes
import datetime
import os
import time

import torch
import torch.distributed as dist

MODE, BAD, AT = os.environ["STOP_MODE"], int(os.environ["STOP_RANK"]), int(os.environ.get("STOP_AT", "60"))


def wait_for_the_next_batch():
    time.sleep(600)


def hold_the_gil():
    # A C call made with the GIL held that no signal interrupts: a default mutex locked twice by one thread
    # deadlocks. No Python thread of this process runs again; py-spy still reads the stack from outside.
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: PTHREAD_MUTEX_INITIALIZER
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
t = torch.ones(1024)
for step in range(100_000):
    if step == AT and rank == BAD:
        print(f"STOP {time.time():.3f}", flush=True)
        wait_for_the_next_batch() if MODE == "sleep" else hold_the_gil()
    dist.all_reduce(t)
    time.sleep(0.05)
