"""A job whose start-up is slow, as on a loaded host (knows nothing of distdoctor; run under torchrun).

Usage: slow_start.py SETUP_S CULPRIT_S
After init_process_group every rank builds its model for SETUP_S seconds (no collective issued yet), and rank 1
for CULPRIT_S seconds more (its peers wait in the first all_reduce); then three steps. CULPRIT_S < 0: rank 1
never gets there (a hang during start-up).
"""

import sys
import time

import torch
import torch.distributed as dist


def build_model(seconds: float) -> torch.nn.Module:
    deadline = time.monotonic() + (seconds if seconds >= 0 else 3600)
    while time.monotonic() < deadline:
        time.sleep(0.05)
    return torch.nn.Linear(4, 4)


def main() -> None:
    setup_s, culprit_s = float(sys.argv[1]), float(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank != 1:
        model = build_model(setup_s)
    else:
        model = build_model(setup_s + culprit_s if culprit_s >= 0 else -1)
    for _ in range(3):
        t = model.weight.detach().sum().reshape(1)
        dist.all_reduce(t)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
