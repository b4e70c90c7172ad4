"""Runs one scenario of the real-library suite (tests/doctor/real/train_*.py on the branch that has it) as a
plain train.py under torchrun, so `distdoctor run` watches it with its own rules (the suite's launcher stops a
hung job after a few seconds by itself, which is what the suite needs but not what a user's job does).

    python -m torch.distributed.run --nproc-per-node 4 benchmarks/real_entry.py --dir DIR --scenario NAME
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import sys

import torch.distributed as dist


class Ctx:
    """What the suite's training functions get (their launcher's Ctx, without its Flight Recorder watchdog)."""

    def __init__(self, rank: int, world: int, out: str):
        self.rank, self.world, self.out = rank, world, out
        self.pg_timeout = datetime.timedelta(seconds=600)

    def step_done(self) -> None:
        pass


def find(directory: str, scenario: str):
    sys.path.insert(0, directory)
    for name in sorted(os.listdir(directory)):
        if name.startswith("train_") and name.endswith(".py"):
            module = importlib.import_module(name[:-3])
            if callable(getattr(module, scenario, None)):
                return getattr(module, scenario)
    raise SystemExit(f"real_entry: no scenario {scenario!r} in {directory}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--scenario", required=True)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    train = find(args.dir, args.scenario)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    out = args.out or os.path.join("/tmp", f"real-entry-{os.getppid()}")
    os.makedirs(out, exist_ok=True)
    train(Ctx(dist.get_rank(), dist.get_world_size(), out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
