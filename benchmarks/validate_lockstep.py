"""What validate's lockstep barrier costs: the same validate run with a world barrier every 1 and every 8 subgroup
cases (validate_exec.LOCKSTEP_EVERY) and with none, interleaved over rounds in one process (the machine is
shared and noisy, so compare the ratios, not the seconds).

    python benchmarks/validate_lockstep.py [--rounds 2] [--nproc 4] [--dtypes float32,bfloat16]
                                           [--sizes 0,1023,64KiB]

Without the barrier a straggler in one subgroup instance lets the other instances run ahead and time out
waiting for it later (see docs/validate.md); the question is only what the barrier adds on a healthy world.
The workers are forked from this process, so setting the module constant here reaches them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from distdoctor.validate import execute as validate_exec  # noqa: E402
from distdoctor.validate.sweep import ValidateOptions, run_validate  # noqa: E402
from distdoctor.world import WorldConfig  # noqa: E402

NO_BARRIER = 10**9  # never a multiple of a case number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--sizes", default="0,1023,64KiB")
    args = parser.parse_args()
    opts = ValidateOptions(dtypes=tuple(args.dtypes.split(",")), sizes=args.sizes)
    settings = {"every case": 1, "every 8 cases": 8, "none": NO_BARRIER}
    walls: dict[str, list[float]] = {name: [] for name in settings}
    for r in range(args.rounds):
        for name, every in settings.items():
            validate_exec.LOCKSTEP_EVERY = every
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            report = run_validate(WorldConfig(nproc=args.nproc), opts)
            walls[name].append(time.perf_counter() - t0)
            assert report["passed"], report["culprits"]
            print(f"round {r + 1}: barrier {name:<14} {walls[name][-1]:6.1f} s  ({len(report['results'])} checks, "
                  f"load {load:.1f})", flush=True)
    base = statistics.median(walls["none"])
    print()
    for name, values in walls.items():
        med = statistics.median(values)
        paired = statistics.median(v / b for v, b in zip(values, walls["none"]))  # each round against its own
        print(f"barrier {name:<14} median {med:6.1f} s  = {med / base:.2f}x no barrier; paired per round "
              f"{paired:.2f}x")


if __name__ == "__main__":
    main()
