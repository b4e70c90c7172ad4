"""A one-rank NCCL job that stops after a few healthy steps. MODE=gpu (default): its GPU stops - a kernel that spins
for minutes is queued ahead of a collective; the CPU enqueues the collective and goes on to a sync point, where it
waits for the GPU; the Python call of the collective returned long before. MODE=cpu: its CPU stops outside
collectives (a sleep), its GPU idle with everything done. Run under `distdoctor run` by scripts/gpu/check.sh."""

import os
import sys
import time

import torch
import torch.distributed as dist

STALL_S = float(os.environ.get("STALL_S", "240"))
MODE = os.environ.get("MODE", "gpu")


def main() -> None:
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    x = torch.ones(1 << 20, device=dev)
    for _ in range(5):  # healthy steps: the recorder learns this job's collective latency
        dist.all_reduce(x)
        torch.cuda.synchronize()
        time.sleep(0.2)
    hz = torch.cuda.get_device_properties(dev).clock_rate * 1e3 if hasattr(
        torch.cuda.get_device_properties(dev), "clock_rate") else 2e9
    print(f"STALL_AT {time.time():.3f}", flush=True)
    if MODE == "cpu":
        time.sleep(STALL_S)  # the CPU stops outside collectives; the GPU has done all it was given
    torch.cuda._sleep(int(hz * STALL_S))  # the GPU's compute stream spins; NCCL's stream waits for it
    dist.all_reduce(x)  # returns at once: enqueued
    dist.all_reduce(x)
    print(f"ENQUEUED {time.time():.3f}", flush=True)
    torch.cuda.synchronize()  # the CPU waits here for a GPU that does not come
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
