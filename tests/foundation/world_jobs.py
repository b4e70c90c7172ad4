"""Small worker functions the world tests run in real ranks."""

import os
import signal
import time


def sum_ranks(ctx, scale=1):
    import torch
    import torch.distributed as dist

    with ctx.phase("all_reduce int64 count=1 group=world"):
        t = torch.tensor([ctx.rank * scale], dtype=torch.int64)
        dist.all_reduce(t)
    ctx.emit({"rank": ctx.rank, "sum": int(t.item())})
    ctx.progress(1, 1, "sum")
    print("worker chatter on stdout must not reach the reporter's stdout")
    return {"rank": ctx.rank, "world_size": ctx.world_size, "sum": int(t.item()), "backend": ctx.backend}


def lose_rank(ctx, victim=1, how="exit"):
    import torch
    import torch.distributed as dist

    with ctx.phase("all_reduce float32 count=4 group=world step=0"):
        t = torch.ones(4)
        dist.all_reduce(t)
    ctx.emit({"step": 0, "rank": ctx.rank})
    with ctx.phase("all_reduce float32 count=4 group=world step=1"):
        if ctx.rank == victim:
            if how == "exit":
                os._exit(7)
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if how == "hang":
                while True:
                    time.sleep(1)
            if how == "raise":
                raise ValueError("planted bug")
        dist.all_reduce(t)
    return {"rank": ctx.rank}


class _SignalledWhileDescribed(ValueError):
    """An error whose description takes a moment, during which the launcher's SIGTERM lands."""

    def __str__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        return "planted bug, described while the launcher stops the rank"


def fail_as_launcher_stops(ctx):
    """The rank's own error, with the launcher's SIGTERM arriving while it is being reported."""
    raise _SignalledWhileDescribed()


def hang_at_end(ctx, victim=1):
    """Every collective completes; then one rank never returns: nobody times out, the watcher must act."""
    import torch
    import torch.distributed as dist

    with ctx.phase("all_reduce float32 count=4 group=world"):
        dist.all_reduce(torch.ones(4))
    if ctx.rank == victim:
        with ctx.phase("post-processing after the last collective"):
            while True:
                time.sleep(1)
    return {"rank": ctx.rank}


def not_json(ctx):
    return object()


def late_hang(ctx, victim=1):
    """The victim enters its (hanging) phase well after the others entered the collective they time out in."""
    import torch
    import torch.distributed as dist

    if ctx.rank == victim:
        time.sleep(2)
        with ctx.phase("data loading after a slow start"):
            while True:
                time.sleep(1)
    with ctx.phase("all_reduce float32 count=4 group=world"):
        dist.all_reduce(torch.ones(4))
    return {"rank": ctx.rank}


def matmul_threads(ctx):
    """A multi-threaded op (MKL/OpenMP) in the worker; returns its intra-op thread count."""
    import torch

    a = torch.randn(512, 512, dtype=torch.float64)
    (a @ a).sum()
    return torch.get_num_threads()
