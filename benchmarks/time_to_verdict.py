"""Time to culprit: from the moment a rank stops to the verdict on the stdout of `distdoctor run` (default flags).

    python benchmarks/time_to_verdict.py                       # every scenario, 4 gloo ranks, once each
    python benchmarks/time_to_verdict.py --scenario sleep,skip --rounds 3 --json

Each scenario is a real 4-rank gloo job (benchmarks/hang_job.py) under
`distdoctor run -- python -m torch.distributed.run --nproc-per-node 4 ...` with run's default flags. The
culprit prints `STOP <time>` when its fault begins; the clock stops when the first `verdict:` line after it
appears on run's stdout (the hang verdict printed while the job still runs, or the closing verdict when the job
died). The job is then killed. Also reported: whether the verdict block names the culprit rank, and which kind
of verdict it was (SUSPECTED / CONFIRMED while running, or the closing report). Scenarios:

  sleep       the culprit's data loader never returns (manual loop of all_reduces)
  exit        the culprit exits mid-training
  skip        the culprit skips one all_reduce on a metrics group
  ddp_loader  DDP training; the culprit's Dataset.__getitem__ never returns
  pause       (no fault) DDP training pausing 30 s every 10 steps for evaluation and a rank-0 checkpoint:
              reports what run said and the exit code instead of a time (--pause-s, --pause-steps)

With --real DIR (the directory of the real-library scenario suite, tests/doctor/real/, where a branch has it),
its hang scenarios (REAL_HANGS: FSDP2, HSDP, DCP, pipelining, DDP with a metrics group, object collectives) run
the same way, each training function called from benchmarks/real_entry.py as a plain train.py under torchrun.
They print no STOP line: the clock starts at the last collective any rank issued or completed, read from the
dumps the verdict was made from (the recorder's entries and Flight Recorder's), i.e. when the job stopped
moving. Scenarios the directory does not provide are reported as absent.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "benchmarks" / "hang_job.py"
HANGS = ("sleep", "exit", "skip", "ddp_loader")
REAL_HANGS = ("fsdp_loader_hang", "dcp_stuck_write", "hsdp_group_order", "metrics_group_alone", "pp_microbatches",
              "p2p_both_recv", "object_root")
REAL_CULPRIT = {"fsdp_loader_hang": 1, "dcp_stuck_write": 2, "metrics_group_alone": 0, "object_root": 3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _command(dump_dir: str, job_args: list[str], run_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "distdoctor", "run", "--dump-dir", dump_dir, *run_args, "--",
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
            "--master-port", str(_free_port()), str(JOB), *job_args]


def _stop(proc: subprocess.Popen, dump_dir: str) -> None:
    """End the job the way a user would (SIGTERM to `distdoctor run`, which passes it to torchrun, which stops
    its workers), then make sure: torchrun starts each worker in its own session, so killing run's process group
    alone would leave them behind. Whatever still has this job's dump directory in its environment is killed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    needle = f"DISTDOCTOR_DUMP_DIR={dump_dir}\0".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    os.kill(int(pid), signal.SIGKILL)
        except OSError:
            continue


def _reader(stream, q: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        q.put((time.time(), line.rstrip("\n")))
    q.put((time.time(), None))


def _last_progress(dump_dir: str) -> float | None:
    """The last moment any rank issued or completed a collective, from the dumps (recorder and Flight
    Recorder)."""
    sys.path.insert(0, str(ROOT / "src"))
    from distdoctor.trace.loaders import load_traces

    times = []
    for trace in load_traces([dump_dir]).ranks.values():
        times += [t for t in trace.column("t_completed") + trace.column("t_created") if t]
    fr = [str(p) for p in Path(dump_dir).glob("rank_*.fr.pkl")]
    for trace in load_traces(fr).ranks.values() if fr else ():
        times += [t for t in trace.column("t_created") if t]
    return max(times) if times else None


def time_one(scenario: str, workdir: Path, limit_s: float, culprit: int = 1, real: Path | None = None) -> dict:
    dump_dir = str(workdir / f"{scenario}-{time.time_ns()}")
    if real is None:
        cmd = _command(dump_dir, ["--scenario", scenario, "--culprit", str(culprit)], [])
    else:
        cmd = _command(dump_dir, ["--dir", str(real), "--scenario", scenario, "--out", dump_dir + "-job"], [])
        cmd[cmd.index(str(JOB))] = str(ROOT / "benchmarks" / "real_entry.py")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(),
                            start_new_session=True)
    q: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
    stop = verdict_at = None
    kind, block, lines = "none", [], []
    deadline = time.time() + limit_s
    try:
        while time.time() < deadline:
            try:
                at, line = q.get(timeout=1)
            except queue.Empty:
                continue
            if line is None:
                break
            lines.append(line)
            if line.startswith("STOP ") and stop is None:
                stop = float(line.split()[1])
            elif (stop is not None or real) and line.startswith("distdoctor run: HANG "):
                kind = line.split()[3].lower()
            elif (stop is not None or real) and line.startswith("verdict:") and verdict_at is None:
                verdict_at = at
                kind = kind if kind != "none" else "closing"
                if real is not None:
                    stop = _last_progress(dump_dir)
            if verdict_at is not None:
                block.append(line)
                if len(block) > 6:
                    break
    finally:
        _stop(proc, dump_dir)
    text = "\n".join(block)
    named = any(f"[{culprit}]" in ln or f"rank {culprit} " in ln for ln in block[:4])
    return {"scenario": scenario, "seconds": round(verdict_at - stop, 2) if stop and verdict_at else None,
            "verdict": kind, "culprit_named": named, "first_lines": text.splitlines()[:4],
            "output_tail": lines[-8:] if verdict_at is None else []}


def run_pause(workdir: Path, pause_s: float, steps: int, every: int, limit_s: float) -> dict:
    dump_dir = str(workdir / f"pause-{time.time_ns()}")
    job = ["--scenario", "pause", "--pause", str(pause_s), "--steps", str(steps), "--every", str(every)]
    t0 = time.time()
    proc = subprocess.Popen(_command(dump_dir, job, []), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=_env(), start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        stdout = ""
    finally:
        _stop(proc, dump_dir)
    out = stdout.splitlines()
    said = [ln for ln in out if ln.startswith("distdoctor run:") or ln.startswith("hang:")]
    return {"scenario": f"pause {pause_s:g} s every {every} steps", "exit_code": proc.returncode,
            "wall_s": round(time.time() - t0, 1), "suspected": sum("HANG SUSPECTED" in ln for ln in out),
            "resumed": sum(ln.startswith("distdoctor run: resumed") for ln in out), "confirmed": sum("HANG CONFIRMED" in ln for ln in out),
            "run_said": said}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scenario", default=",".join(HANGS + ("pause",)))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--limit", type=float, default=240.0, help="give up on a scenario after this many seconds")
    p.add_argument("--pause-s", type=float, default=30.0)
    p.add_argument("--pause-steps", type=int, default=35)
    p.add_argument("--pause-every", type=int, default=10)
    p.add_argument("--workdir", default=None)
    p.add_argument("--real", default=None, help="the real-library scenario suite's directory, if present")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    workdir = Path(args.workdir or os.path.join("/tmp", f"ttv-{os.getpid()}"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = []
    for scenario in [s for s in args.scenario.split(",") if s]:
        if scenario == "pause":
            results.append(run_pause(workdir, args.pause_s, args.pause_steps, args.pause_every,
                                     args.limit + args.pause_s * 8))
            if not args.json:
                print(json.dumps(results[-1]), flush=True)
            continue
        rounds = [time_one(scenario, workdir, args.limit) for _ in range(args.rounds)]
        secs = [r["seconds"] for r in rounds if r["seconds"] is not None]
        res = {"scenario": scenario, "seconds": secs, "median_s": statistics.median(secs) if secs else None,
               "max_s": max(secs) if secs else None, "verdicts": [r["verdict"] for r in rounds],
               "culprit_named": [r["culprit_named"] for r in rounds], "first_lines": rounds[-1]["first_lines"]}
        if any(r["seconds"] is None for r in rounds):
            res["missed"] = [r["output_tail"] for r in rounds if r["seconds"] is None]
        results.append(res)
        if not args.json:
            print(f"{scenario:11s} {', '.join(f'{s:.1f}' for s in secs) or '-':>20s} s   verdict "
                  f"{'/'.join(res['verdicts'])}; culprit named: {'/'.join(map(str, res['culprit_named']))}",
                  flush=True)
    real = Path(args.real).resolve() if args.real else None
    note = None if real and real.is_dir() else "the real-library scenario suite (tests/doctor/real/) is not here"
    if real and real.is_dir():
        for scenario in REAL_HANGS:
            if not any(f"def {scenario}(" in p.read_text() for p in real.glob("train_*.py")):
                results.append({"scenario": scenario, "absent": True})
                continue
            rounds = [time_one(scenario, workdir, args.limit, REAL_CULPRIT.get(scenario, -1), real)
                      for _ in range(args.rounds)]
            secs = [r["seconds"] for r in rounds if r["seconds"] is not None]
            res = {"scenario": f"real:{scenario}", "seconds": secs, "max_s": max(secs) if secs else None,
                   "verdicts": [r["verdict"] for r in rounds], "first_lines": rounds[-1]["first_lines"]}
            if scenario in REAL_CULPRIT:
                res["culprit_named"] = [r["culprit_named"] for r in rounds]
            results.append(res)
            if not args.json:
                print(f"{'real:' + scenario:26s} {', '.join(f'{s:.1f}' for s in secs) or '-':>12s} s   verdict "
                      f"{'/'.join(res['verdicts'])}" + (f"; culprit named: {'/'.join(map(str, res['culprit_named']))}"
                                                       if "culprit_named" in res else ""), flush=True)
    summary = {"machine": f"{platform.node()} ({os.cpu_count()} cores), load {os.getloadavg()[0]:.1f}",
               "torch": _torch_version(), "results": results, "real_suite": note or str(real)}
    if args.json:
        print(json.dumps(summary, indent=1))
    elif note:
        print(f"({note})")


def _torch_version() -> str:
    try:
        import torch

        return torch.__version__
    except ImportError:
        return "?"


if __name__ == "__main__":
    main()
