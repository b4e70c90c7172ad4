"""`distdoctor sim from-trace` of a recorded 4-rank x 2000-call run: wall time of the command (limit 2 s).

    python benchmarks/sim_from_trace.py [--calls 2000] [--ranks 4] [--rounds 3] [--keep DIR]

Records a real run first: `--ranks` Gloo ranks on this machine, each with the recorder enabled and dumping on
exit (what `distdoctor run --dump-on-exit` does), issue `--calls` calls each — per iteration a blocking
all_reduce on the world, an async all_reduce on a second group and its wait, and a ring exchange (isend to the
next rank, recv from the previous one). Then, `--rounds` times in turn, runs

    python -m distdoctor sim from-trace DIR --format json                   (as recorded)
    python -m distdoctor sim from-trace DIR --streams shared --eager-bytes 0 --format json

and reports each one's wall and CPU time (the whole command: interpreter start, loading the dumps, building the program,
simulating, the report), best and median, and, in this process, where the time goes (load, build, simulate).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def worker(calls: int) -> None:
    import torch
    import torch.distributed as dist

    from distdoctor import recorder

    recorder.enable()
    dist.init_process_group("gloo")
    r, n = dist.get_rank(), dist.get_world_size()
    other = dist.new_group(list(range(n)))
    x, y, a, b = torch.ones(256), torch.ones(256), torch.ones(64), torch.ones(64)
    for _ in range(calls // 4):
        dist.all_reduce(x)
        work = dist.all_reduce(y, group=other, async_op=True)
        send = dist.isend(a, (r + 1) % n)
        dist.recv(b, (r - 1) % n)
        send.wait()
        work.wait()
    dist.destroy_process_group()  # dumps (DISTDOCTOR_DUMP_ON_EXIT)


def record(out: Path, ranks: int, calls: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(ranks),
           "DISTDOCTOR_DUMP_DIR": str(out), "DISTDOCTOR_DUMP_ON_EXIT": "1", "DISTDOCTOR_BUFFER": str(calls + 100),
           "DISTDOCTOR_STACKS": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--calls", str(calls)],
                              env={**env, "RANK": str(r)}) for r in range(ranks)]
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        sys.exit(f"recording failed: rank exit codes {codes}")
    return time.perf_counter() - t0


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_cli(args: list[str]) -> tuple[float, float, dict]:
    """(wall s, CPU s, the JSON report) of one `distdoctor sim from-trace` command."""
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    c0, t0 = _children_cpu(), time.perf_counter()
    got = subprocess.run([sys.executable, "-m", "distdoctor", "sim", "from-trace", *args, "--format", "json"],
                         capture_output=True, text=True, env=env, timeout=120)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if got.returncode not in (0, 1):
        sys.exit(f"from-trace failed ({got.returncode}): {got.stderr.strip()}")
    return wall, cpu, json.loads(got.stdout)


def phases(path: str) -> dict:
    sys.path.insert(0, str(SRC))
    from distdoctor.sim.plans.from_trace import load_recorded, replay_program
    from distdoctor.sim.result import simulate

    t0 = time.perf_counter()
    ts = load_recorded([path])
    t1 = time.perf_counter()
    replay = replay_program(ts)
    t2 = time.perf_counter()
    simulate(replay.program)
    t3 = time.perf_counter()
    return {"load_s": round(t1 - t0, 3), "build_s": round(t2 - t1, 3), "simulate_s": round(t3 - t2, 3),
            "ops": replay.program.op_count()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", help="record into (or reuse the recording in) this directory")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.calls)
        return
    out = Path(args.keep or tempfile.mkdtemp(prefix="distdoctor-fromtrace-"))
    if not list(out.glob("rank_*.jsonl")):
        print(f"recording {args.ranks} ranks x {args.calls} calls into {out} ...", flush=True)
        print(f"  recorded in {record(out, args.ranks, args.calls):.1f} s", flush=True)
    what_ifs = {"as recorded": [str(out)], "shared, eager 0": [str(out), "--streams", "shared", "--eager-bytes", "0"]}
    walls: dict[str, list[float]] = {k: [] for k in what_ifs}
    cpus: dict[str, list[float]] = {k: [] for k in what_ifs}
    docs = {}
    for _ in range(args.rounds):
        for name, cli in what_ifs.items():
            wall, cpu, docs[name] = run_cli(cli)
            walls[name].append(wall)
            cpus[name].append(cpu)
    load = os.getloadavg()
    for name, w in walls.items():
        ft = docs[name]["from_trace"]
        print(f"{name:16s} wall best {min(w):.2f} s, median {statistics.median(w):.2f} s (limit 2 s); CPU best "
              f"{min(cpus[name]):.2f} s; "
              f"{ft['calls']} calls, deadlock {docs[name]['deadlock']}, recorded {ft['recorded_makespan_us'] / 1e3:.1f} ms,"
              f" simulated {ft['simulated_makespan_us'] / 1e3:.1f} ms")
    print(f"in-process phases: {phases(str(out))}")
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")


if __name__ == "__main__":
    main()
