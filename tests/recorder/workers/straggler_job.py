"""Runs of a 4-rank job: DDP training steps, then a manual loop (a gradient all_reduce and a small metrics
all_reduce per step). With a late time > 0, rank 1 sleeps that long before every step (its data loading is
slow). The recorder dumps at destroy_process_group (dump_on_exit), Flight Recorder's dump beside ours: its
entries hold DDP's buckets, ours the manual loop.

    straggler_job.py OUT LATE_MS [LATE_MS ...]    # one run per LATE_MS, dumps in OUT/run_<i>/

torch is imported once and each run's ranks are forked from here (as tests/doctor/scenarios/jobs.py does):
on two cores a run then costs its steps, not four interpreter start-ups. Each run is its own gloo job (new
port, new processes); the parent waits for its ranks and exits 0 only when every rank did.
"""

import os
import socket
import sys
import time

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import distdoctor.recorder as recorder  # noqa: E402

WORLD, STEPS = 4, 10


def rank_main(rank: int, port: int, out: str, late: float) -> None:
    recorder.enable(dump_dir=out, hang_timeout=0, dump_on_exit=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        if rank == 1:
            time.sleep(late)
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    w = torch.randn(64, 64)
    for _ in range(STEPS):
        if rank == 1:
            time.sleep(late)
        grad = (torch.randn(8, 64) @ w).sum(0)
        dist.all_reduce(grad)  # the gradient: the slow rank arrives late here
        dist.all_reduce(grad.norm().reshape(1))  # metrics, right after a synchronizing call: nobody is late
    dist.destroy_process_group()


def one_run(out: str, late: float) -> bool:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = []
    for rank in range(WORLD):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                rank_main(rank, port, out, late)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    return all(os.waitpid(pid, 0)[1] == 0 for pid in pids)


if __name__ == "__main__":
    torch.set_num_threads(1)
    ok = [one_run(os.path.join(sys.argv[1], f"run_{i}"), float(ms) / 1000) for i, ms in enumerate(sys.argv[2:])]
    sys.exit(0 if all(ok) else 1)
