"""Recorder overhead: added cost per torch.distributed call, and on a small DDP training loop.

    python benchmarks/recorder_overhead.py            # full run (about a minute on 2 cores)
    python benchmarks/recorder_overhead.py --quick    # smoke run

Method. Two gloo ranks on this machine run, in ONE job, interleaved rounds with the recorder off (plain
torch.distributed, functions unpatched) and on (`distdoctor.trace.enable()`), so machine noise hits both alike:
  1. all_reduce of 1 float32 element, `--calls` per round: µs/call off and on, and the difference per pair of
     adjacent rounds (median);
  2. the recording work alone (describe + ring-buffer append + completion, no communication), µs/call;
  3. a small DDP training loop (MLP, batch 32, SGD, plus the usual loss all_reduce for logging): ms/step off
     and on, overhead in % of step time (median of per-pair ratios).
Flight Recorder is on (TORCH_FR_BUFFER_SIZE) in both modes, as `distdoctor run` sets it before the process
group exists; it cannot be toggled within a job, so this isolates the cost of our Python-level recorder.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_recorder(on: bool, dump_dir: str) -> None:
    import distdoctor.trace as trace

    if on:
        trace.enable(dump_dir=dump_dir, hang_timeout=0)
    else:
        trace.disable()


def _time_calls(dist, x, calls: int) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter() - t0) / calls * 1e6


def _recording_alone(calls: int) -> float:
    """µs per call of the recorder's own work (what the wrapper adds besides calling torch)."""
    import torch

    from distdoctor.trace import get_recorder
    from distdoctor.trace.describe import DESCRIBERS

    rec = get_recorder()
    _, describer, _ = DESCRIBERS["all_reduce"]
    x = torch.zeros(1)
    t0 = time.perf_counter()
    for _ in range(calls):
        r = rec.begin("all_reduce", "all_reduce", describer(x), False)
        rec.complete(r)
    return (time.perf_counter() - t0) / calls * 1e6


def _ddp_steps(model, opt, data, target, steps: int, dist) -> float:
    import torch

    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # what training loops do to log a global loss
    return (time.perf_counter() - t0) / steps * 1e3


def _worker(rank: int, world: int, port: int, args, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_FR_BUFFER_SIZE="2000")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    dump_dir = tempfile.mkdtemp(prefix="dd-bench-")
    x = torch.zeros(1)
    _time_calls(dist, x, 200)  # warm-up

    calls = {"off": [], "on": []}
    for i in range(args.rounds):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            _set_recorder(mode == "on", dump_dir)
            calls[mode].append(_time_calls(dist, x, args.calls))
    _set_recorder(True, dump_dir)
    alone = statistics.median(_recording_alone(args.calls * 5) for _ in range(5))
    _set_recorder(False, dump_dir)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(32, 256), torch.randint(0, 10, (32,))
    _ddp_steps(model, opt, data, target, 5, dist)  # warm-up
    steps = {"off": [], "on": []}
    for i in range(args.rounds):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            _set_recorder(mode == "on", dump_dir)
            steps[mode].append(_ddp_steps(model, opt, data, target, args.steps, dist))
    _set_recorder(False, dump_dir)
    dist.barrier()
    if rank == 0:
        Path(out_path).write_text(json.dumps({"calls": calls, "alone": alone, "steps": steps}))
    dist.destroy_process_group()


def summarize(raw: dict) -> dict:
    c, s = raw["calls"], raw["steps"]
    call_diff = statistics.median(on - off for on, off in zip(c["on"], c["off"]))
    step_pct = statistics.median((on / off - 1) * 100 for on, off in zip(s["on"], s["off"]))
    return {
        "all_reduce_us_off": statistics.median(c["off"]), "all_reduce_us_on": statistics.median(c["on"]),
        "added_us_per_call": call_diff, "recording_alone_us": raw["alone"],
        "ddp_step_ms_off": statistics.median(s["off"]), "ddp_step_ms_on": statistics.median(s["on"]),
        "ddp_overhead_pct": step_pct, "rounds": len(c["on"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="all_reduce calls per round")
    parser.add_argument("--steps", type=int, default=30, help="DDP steps per round")
    parser.add_argument("--rounds", type=int, default=6, help="on/off round pairs")
    parser.add_argument("--quick", action="store_true", help="tiny run, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.steps, args.rounds = 50, 3, 2
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.start_processes(_worker, args=(2, _free_port(), args, out), nprocs=2, join=True, start_method="spawn")
        result = summarize(json.loads(Path(out).read_text()))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"| measure (2 gloo ranks, {result['rounds']} on/off round pairs) | recorder off | recorder on | added |")
    print("|---|---|---|---|")
    print(f"| all_reduce, 1 element (µs/call) | {result['all_reduce_us_off']:.1f} | {result['all_reduce_us_on']:.1f} "
          f"| {result['added_us_per_call']:+.1f} µs |")
    print(f"| recording work alone (µs/call) | - | {result['recording_alone_us']:.2f} | |")
    print(f"| DDP step, MLP 256-512-512-10, batch 32 (ms) | {result['ddp_step_ms_off']:.2f} "
          f"| {result['ddp_step_ms_on']:.2f} | {result['ddp_overhead_pct']:+.2f} % |")


if __name__ == "__main__":
    main()
