"""Recorder overhead: added cost per torch.distributed call, and on a small DDP training loop.

    python benchmarks/recorder_overhead.py            # full run (about a minute on 2 cores)
    python benchmarks/recorder_overhead.py --quick    # smoke run

Method. Two gloo ranks on this machine run, in ONE job, interleaved rounds with the recorder off (plain
torch.distributed, functions unpatched) and on (`distdoctor.recorder.enable()`), so machine noise hits both alike:
  1. all_reduce of 1 float32 element, `--calls` per round: µs/call off and on, and the difference per pair of
     adjacent rounds (median);
  2. the recording work alone (describe + ring-buffer append + completion, no communication), µs/call;
  3. a small DDP training loop (MLP, batch 32, SGD, plus the usual loss all_reduce for logging): ms/step off
     and on, overhead in % of step time (median of per-pair ratios).
The DDP figure is also bounded from below the noise: calls the recorder saw per step (DDP's gradient buckets
are issued from C++ and never reach it) times the added CPU per call, over the step time; and the best round of
each mode is compared. Each is reported as wall time and as CPU time (calling-thread CPU for 1. and 2.,
process CPU for 3.): on a shared, oversubscribed machine wall time mostly measures the scheduler, while the
recorder's cost is CPU on the calling thread.
Flight Recorder is on (TORCH_FR_BUFFER_SIZE) in both modes, as `distdoctor run` sets it before the process
group exists; it cannot be toggled within a job, so this isolates the cost of our Python-level recorder.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
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
    import distdoctor.recorder as recorder

    if on:  # as `distdoctor run` starts it: hang detection on (the watchdog ticks every second)
        recorder.enable(dump_dir=dump_dir, hang_timeout=300, suspect_floor=10)
    else:
        recorder.disable()


def _time_calls(dist, x, calls: int) -> tuple[float, float]:
    """(wall µs, calling-thread CPU µs) per all_reduce call. The recorder runs on the calling thread; gloo's
    transfer runs on its own threads, whose CPU (spinning while the peer is descheduled) would only add noise."""
    dist.barrier()
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter() - t0) / calls * 1e6, (time.thread_time() - c0) / calls * 1e6


def _recording_alone(calls: int) -> float:
    """µs per call of the recorder's own work (what the wrapper adds besides calling torch)."""
    import torch

    from distdoctor.recorder import get_recorder
    from distdoctor.recorder.describe import DESCRIBERS

    rec = get_recorder()
    describer, _ = DESCRIBERS["all_reduce"]
    x = torch.zeros(1)
    t0 = time.thread_time()  # CPU time of this thread: immune to the machine's other load
    for _ in range(calls):
        r = rec.begin("all_reduce", "all_reduce", describer(x), False)
        rec.complete(r)
    return (time.thread_time() - t0) / calls * 1e6


def _last_index() -> int:
    from distdoctor.recorder import get_recorder

    rec = get_recorder()
    return rec.buffer[-1].index if rec is not None and rec.buffer else -1


def _ddp_steps(model, opt, data, target, steps: int, dist) -> tuple[float, float]:
    """(wall ms, process CPU ms) per training step."""
    import torch

    dist.barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)  # what training loops do to log a global loss
    return (time.perf_counter() - t0) / steps * 1e3, (time.process_time() - c0) / steps * 1e3


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
    _ddp_steps(model, opt, data, target, 2, dist)  # warm-up
    steps = {"off": [], "on": []}
    recorded = 0
    for i in range(args.rounds):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            _set_recorder(mode == "on", dump_dir)
            last = _last_index()
            steps[mode].append(_ddp_steps(model, opt, data, target, args.steps, dist))
            if mode == "on":
                recorded += _last_index() - last - 1  # minus the barrier that starts the round
    _set_recorder(False, dump_dir)
    dist.barrier()
    if rank == 0:
        Path(out_path).write_text(json.dumps({"calls": calls, "alone": alone, "steps": steps,
                                              "calls_per_step": recorded / (args.rounds * args.steps)}))
    dist.destroy_process_group()


def summarize(raw: dict) -> dict:
    """Medians over rounds; the added cost is the median over adjacent off/on pairs (noise hits both alike)."""
    c, s = raw["calls"], raw["steps"]
    out = {"rounds": len(c["on"]), "recording_alone_cpu_us": raw["alone"]}
    for i, kind in enumerate(("wall", "cpu")):
        off = [v[i] for v in c["off"]]
        on = [v[i] for v in c["on"]]
        out[f"all_reduce_{kind}_us_off"] = statistics.median(off)
        out[f"all_reduce_{kind}_us_on"] = statistics.median(on)
        out[f"added_{kind}_us_per_call"] = statistics.median(b - a for a, b in zip(off, on))
        off = [v[i] for v in s["off"]]
        on = [v[i] for v in s["on"]]
        out[f"ddp_step_{kind}_ms_off"] = statistics.median(off)
        out[f"ddp_step_{kind}_ms_on"] = statistics.median(on)
        out[f"ddp_step_{kind}_ms_min_off"], out[f"ddp_step_{kind}_ms_min_on"] = min(off), min(on)
        out[f"ddp_{kind}_overhead_pct"] = statistics.median((b / a - 1) * 100 for a, b in zip(off, on))
        out[f"ddp_{kind}_best_round_pct"] = (min(on) / min(off) - 1) * 100  # least disturbed round of each
    # What the recorder can cost a step at most: the calls it records per step times the added CPU per call.
    out["ddp_recorded_calls_per_step"] = raw["calls_per_step"]
    out["ddp_bound_pct"] = (raw["calls_per_step"] * max(out["added_cpu_us_per_call"], 0)
                            / (out["ddp_step_wall_ms_off"] * 1e3) * 100)
    return out


def min_ms(r: dict, mode: str) -> str:
    return f"{r[f'ddp_step_wall_ms_min_{mode}']:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="all_reduce calls per round")
    parser.add_argument("--steps", type=int, default=30, help="DDP steps per round")
    parser.add_argument("--rounds", type=int, default=6, help="on/off round pairs")
    parser.add_argument("--quick", action="store_true", help="tiny run, for a smoke test")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.add_argument("--worker", nargs=3, metavar=("RANK", "PORT", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.calls, args.steps, args.rounds = 50, 2, 2
    if args.worker:
        rank, port, out = args.worker
        _worker(int(rank), 2, int(port), args, out)
        return
    # Two plain subprocesses (this parent never imports torch), each killed if the other fails.
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        port = str(_free_port())
        passthrough = ["--calls", str(args.calls), "--steps", str(args.steps), "--rounds", str(args.rounds)]
        procs = [subprocess.Popen([sys.executable, __file__, *passthrough, "--worker", str(r), port, out])
                 for r in range(2)]
        try:
            codes = [p.wait(timeout=900) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if codes != [0, 0]:
            sys.exit(f"recorder_overhead: a worker failed (exit codes {codes})")
        result = summarize(json.loads(Path(out).read_text()))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    r = result
    print(f"| measure (2 gloo ranks, {r['rounds']} interleaved off/on round pairs) | off | on | added |")
    print("|---|---|---|---|")
    for kind, unit in (("wall", "wall"), ("cpu", "calling-thread CPU")):
        print(f"| all_reduce of 1 element, {unit} µs/call | {r[f'all_reduce_{kind}_us_off']:.1f} "
              f"| {r[f'all_reduce_{kind}_us_on']:.1f} | {r[f'added_{kind}_us_per_call']:+.1f} µs |")
    print(f"| recording work alone, thread CPU µs/call | - | {r['recording_alone_cpu_us']:.2f} | |")
    for kind, unit in (("wall", "wall"), ("cpu", "process CPU")):
        print(f"| DDP step (MLP 256-512-512-10, batch 32), {unit} ms | {r[f'ddp_step_{kind}_ms_off']:.2f} "
              f"| {r[f'ddp_step_{kind}_ms_on']:.2f} | {r[f'ddp_{kind}_overhead_pct']:+.2f} % |")
    print(f"| DDP step, best round of each mode (wall) | {min_ms(r, 'off')} | {min_ms(r, 'on')} "
          f"| {r['ddp_wall_best_round_pct']:+.2f} % |")
    print(f"| DDP step: recorded calls per step x added CPU per call / step time | | "
          f"{r['ddp_recorded_calls_per_step']:.0f} call(s) | {r['ddp_bound_pct']:.2f} % |")


if __name__ == "__main__":
    main()
