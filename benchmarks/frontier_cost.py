"""What a rank's dump pays to carry its communicator's frontier (recorder/dumpfile.py `fr_standing`) beside the
Flight Recorder pickle it already writes, on a one-rank Gloo group whose Flight Recorder holds N calls.

    python benchmarks/frontier_cost.py [--calls 2000] [--samples 20]

Prints the median of each, in turns, and their ratio (this machine is shared: compare side by side)."""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--samples", type=int, default=20)
    args = ap.parse_args()
    os.environ["TORCH_FR_BUFFER_SIZE"] = str(args.calls)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch
    import torch.distributed as dist

    from distdoctor.recorder.dumpfile import flight_recorder_dump, fr_standing

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    t = torch.ones(16)
    for _ in range(args.calls):
        dist.all_reduce(t)
    pickle_s, standing_s = [], []
    for _ in range(args.samples):
        t0 = time.perf_counter()
        flight_recorder_dump()
        pickle_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fr_standing()
        standing_s.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    a, b = statistics.median(pickle_s), statistics.median(standing_s)
    print(f"{args.calls} calls, {args.samples} samples: Flight Recorder pickle {a * 1e3:.1f} ms, "
          f"fr_standing {b * 1e3:.1f} ms (ratio {b / a:.2f}); load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
