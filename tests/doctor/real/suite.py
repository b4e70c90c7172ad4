"""Run the real-library scenarios under `distdoctor run` and lay their dumps out in the four modes diagnose reads.

    python tests/doctor/real/suite.py --out DIR [--scenario a,b,...] [--parallel N] [--seed S]

For each scenario this runs, as a user would,

    python -m distdoctor run --dump-dir DIR/<scenario>/recorder --hang-timeout 4 --dump-on-exit -- \\
        python tests/doctor/real/jobs.py --out DIR/<scenario> --scenario <scenario> --stall 3

(several scenarios at once, each in its own session, killed as a whole at its deadline) and then reads

    DIR/<scenario>/recorder         the recorder's rank_<r>.jsonl + rank_<r>.fr.pkl, as `distdoctor run` left them
    DIR/<scenario>/modes/pickle     the job's own Flight Recorder pickles (with stack frames)
    DIR/<scenario>/modes/json       the job's own Flight Recorder JSON dumps (no frames)
    DIR/<scenario>/modes/mixed      per rank, one of the three at random (seeded by --seed and the scenario)

From the command line it also prints the first finding `distdoctor diagnose --format json` gives in each mode
(the scoreboard the tests in test_real_jobs.py judge). `python -m distdoctor` is this checkout's when
PYTHONPATH holds its src/ (the tests set it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, "jobs.py")


def _load_jobs():
    """jobs.py (the launcher) as a module of its own name; it imports torch only when launching."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("distdoctor_real_jobs", JOBS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_jobs = _load_jobs()
SCENARIOS, WORLD = _jobs.SCENARIOS, _jobs.WORLD
LINT_SCENARIOS = _jobs.LINT_SCENARIOS  # lint's hazard jobs and fixed twins (test_lint_real.py)

MODES = ("recorder", "pickle", "json", "mixed")
HANG_TIMEOUT_S = 4  # the recorder's --hang-timeout
STALL_S = 3  # the job's own Flight Recorder watchdog
MIXED_SEED = 1597  # the mixed mode's per-rank draw; every scenario's draw has one right answer (test_real_jobs.py)
SCENARIO_DEADLINE_S = 45  # the launcher kills its ranks then; the harness kills the whole session 15 s later


def run_command(name: str, out: str) -> list[str]:
    scenario_dir = os.path.join(out, name)
    return [sys.executable, "-m", "distdoctor", "run", "--dump-dir", os.path.join(scenario_dir, "recorder"),
            "--hang-timeout", str(HANG_TIMEOUT_S), "--dump-on-exit", "--",
            sys.executable, JOBS, "--out", scenario_dir, "--scenario", name, "--stall", str(STALL_S),
            "--deadline", str(SCENARIO_DEADLINE_S)]


def _group_alive(pgid: int) -> list[int]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from procs import PGRP, live_processes

    return live_processes(PGRP, pgid)


def run_suite(out: str, names: list[str] | None = None, parallel: int = 4, seed: int = MIXED_SEED,
              env: dict | None = None) -> dict[str, dict]:
    """Run the scenarios (at most `parallel` at once) and build their mode directories. Returns, per scenario:
    run_rc (distdoctor run's exit code), job (jobs.py's status line), leftover (pids still alive in its
    session when distdoctor run returned), seconds, stderr and stdout (paths of distdoctor run's streams: its verdicts are on stdout), modes."""
    names = list(names or SCENARIOS)
    os.makedirs(out, exist_ok=True)
    queue, running, results = list(names), {}, {}
    t0 = time.monotonic()
    while queue or running:
        while queue and len(running) < parallel:
            name = queue.pop(0)
            d = os.path.join(out, name)
            os.makedirs(d, exist_ok=True)
            so, se = open(os.path.join(d, "run.stdout"), "w"), open(os.path.join(d, "run.stderr"), "w")
            proc = subprocess.Popen(run_command(name, out), stdout=so, stderr=se, env=env, start_new_session=True)
            running[name] = (proc, time.monotonic(), so, se)
        time.sleep(0.2)
        for name, (proc, started, so, se) in list(running.items()):
            late = time.monotonic() - started > SCENARIO_DEADLINE_S + 15
            if proc.poll() is None and not late:
                continue
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            leftover = _group_alive(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            so.close()
            se.close()
            del running[name]
            results[name] = _collect(out, name, proc.returncode, leftover, time.monotonic() - started, seed)
    results["_wall_s"] = round(time.monotonic() - t0, 1)  # type: ignore[assignment]
    return results


def _collect(out: str, name: str, rc: int, leftover: list[int], seconds: float, seed: int) -> dict:
    d = os.path.join(out, name)
    job = None
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(d, "status.json")) as f:
            job = json.load(f)
    return {"run_rc": rc, "job": job, "leftover": leftover, "seconds": round(seconds, 1),
            "stderr": os.path.join(d, "run.stderr"), "stdout": os.path.join(d, "run.stdout"), "modes": build_modes(d, seed, name),
            "mix": mixed_choice(seed, name)}


def mixed_choice(seed: int, name: str) -> dict[int, str]:
    """Which dump each rank contributes to the mixed mode: recorder, pickle or json, drawn per rank."""
    rng = random.Random(f"{seed}:{name}")
    return {r: rng.choice(("recorder", "pickle", "json")) for r in range(WORLD)}


def _rank_files(d: str, mode: str, rank: int) -> list[str]:
    """The files rank `rank` left for `mode`: everything the recorder wrote for it (rank_<r>.*), or the job's
    own Flight Recorder dump of that form."""
    if mode == "recorder":
        folder, prefix = os.path.join(d, "recorder"), f"rank_{rank}."
    else:
        folder, prefix = os.path.join(d, "fr", mode), f"fr_rank_{rank}."
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    return [os.path.join(folder, n) for n in names if n.startswith(prefix)]


def build_modes(d: str, seed: int, name: str) -> dict[str, str]:
    """The directory diagnose reads for each mode: the recorder's own --dump-dir as `distdoctor run` left it,
    and DIR/<scenario>/modes/<mode>/ holding copies of each rank's files for the others."""
    mix = mixed_choice(seed, name)
    dirs = {"recorder": os.path.join(d, "recorder")}
    os.makedirs(dirs["recorder"], exist_ok=True)  # a job that left no dump at all: an empty directory
    for mode in MODES[1:]:
        target = os.path.join(d, "modes", mode)
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        for rank in range(WORLD):
            for path in _rank_files(d, mix[rank] if mode == "mixed" else mode, rank):
                shutil.copy(path, target)
        dirs[mode] = target
    return dirs


def diagnose_json(path: str) -> tuple[int, dict | None, str]:
    """`distdoctor diagnose PATH --format json`, in this process: (exit code, document or None, stderr)."""
    return command_json("diagnose", path)


def command_json(command: str, path: str) -> tuple[int, dict | None, str]:
    """`distdoctor COMMAND PATH --format json` (diagnose, lint), in this process: (exit code, document or None,
    stderr)."""
    from distdoctor.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([command, path, "--format", "json"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    try:
        doc = json.loads(out.getvalue())
    except ValueError:
        doc = None
    return code, doc, err.getvalue()


def first_finding(doc: dict | None) -> str:
    """One line: 'ok' or the first finding's kind, ranks, group, seq, op."""
    if doc is None:
        return "no report"
    if not doc["findings"]:
        return f"verdict {doc['verdict']}, no finding"
    f = doc["findings"][0]
    return f"{f['kind']} {f['ranks']} group {f['group']!r} seq {f['seq']} {f['op']}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", default="", help="comma-separated (default: all)")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--seed", type=int, default=MIXED_SEED)
    args = parser.parse_args()
    names = [s for s in args.scenario.split(",") if s] or [*SCENARIOS, *LINT_SCENARIOS]
    results = run_suite(os.path.abspath(args.out), names, args.parallel, args.seed)
    for name in names:
        r = results[name]
        job = r["job"] or {}
        print(f"{name}: run rc {r['run_rc']}, ranks {job.get('exitcodes')} ({job.get('ended')}), {r['seconds']} s, "
              f"mix {r['mix']}")
        for mode in MODES:
            code, doc, _ = diagnose_json(r["modes"][mode])
            print(f"  {mode:9s} exit {code}: {first_finding(doc)}")
    print(f"wall {results['_wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
