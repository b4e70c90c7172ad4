"""`distdoctor run` while the job is still up, on real 4-rank gloo jobs under torchrun (benchmarks/hang_job.py):
a suspected hang is printed on stdout with the culprit while the job keeps running, confirmed after the hang
timeout and stopped only with --kill-on-hang; a healthy job that pauses is reported as suspected then resumed,
never confirmed, and ends with exit 0; a crash is never followed by `verdict: OK`. Short floors and timeouts
keep the tests short (the default figures are measured by benchmarks/time_to_verdict.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from procs import run_in_session
from recorder_helpers import free_port, kill_job_processes

from distdoctor.trace.model import loads

pytestmark = pytest.mark.slow

JOB = Path(__file__).resolve().parents[2] / "benchmarks" / "hang_job.py"


def run_job(tmp_path, cli_env, run_args, job_args, nproc=4, timeout=240):
    dumps = tmp_path / "dumps"
    cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), *run_args, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(JOB), *job_args]
    env = dict(cli_env, OMP_NUM_THREADS="1")
    try:
        done = run_in_session(cmd, timeout=timeout, env=env)
    finally:
        orphans = kill_job_processes(dumps)  # torchrun's workers live in their own sessions
    assert orphans == [], f"ranks outlived distdoctor run: {orphans}"
    return done, dumps


def hidden_left(dumps: Path) -> list[str]:
    return sorted(p.name for p in dumps.iterdir() if p.name.startswith(".")) if dumps.exists() else []


def test_sleeping_rank_suspected_then_confirmed_and_stopped(tmp_path, cli_env):
    done, dumps = run_job(tmp_path, cli_env, ["--suspect-floor", "2", "--hang-timeout", "7", "--kill-on-hang"],
                          ["--scenario", "sleep", "--at", "3"])
    out = done.stdout
    assert done.returncode != 0, out[-3000:]
    assert done.leftover == [], "processes outlived distdoctor run"
    lines = out.splitlines()
    at = {key: next((i for i, ln in enumerate(lines) if ln.startswith(key)), None)
          for key in ("STOP", "distdoctor run: HANG SUSPECTED", "distdoctor run: HANG CONFIRMED",
                      "distdoctor run: stopping the job")}
    assert None not in at.values(), (at, out[-4000:])
    assert at["STOP"] < at["distdoctor run: HANG SUSPECTED"] < at["distdoctor run: HANG CONFIRMED"] \
        < at["distdoctor run: stopping the job"], out[-4000:]
    suspected = "\n".join(lines[at["distdoctor run: HANG SUSPECTED"]:at["distdoctor run: HANG CONFIRMED"]])
    assert "The job keeps running." in suspected and "did not within" not in suspected  # every rank dumped
    assert "missing_ranks: ranks [1] at all_reduce" in suspected, suspected
    hang = next(ln for ln in suspected.splitlines() if ln.startswith("hang: suspected"))
    assert "ranks 0, 2, 3 blocked" in hang and "rank 1 in no collective" in hang and "load_batch" in hang, hang
    assert "threshold 2 s = max(floor 2 s" in hang, hang
    # each verdict line prints its own time: the confirmation ~5 s after the suspicion, which it also names
    clock = lambda ln: sum(int(x) * m for x, m in zip(ln.split(" at ")[1][:8].split(":"), (3600, 60, 1)))  # noqa: E731
    s_line, c_line = lines[at["distdoctor run: HANG SUSPECTED"]], lines[at["distdoctor run: HANG CONFIRMED"]]
    assert f"(suspected at {s_line.split(' at ')[1][:8]})" in c_line, (s_line, c_line)
    assert 3 <= (clock(c_line) - clock(s_line)) % 86400 <= 30, (s_line, c_line)
    # the last dumps (SIGTERM from --kill-on-hang) still carry the confirmed episode; nothing hidden is left
    traces = [loads((dumps / f"rank_{r}.jsonl").read_text()) for r in range(4)]
    assert all(t.hang and t.hang["status"] == "confirmed" for t in traces), [t.hang for t in traces]
    assert hidden_left(dumps) == []


def test_healthy_job_that_pauses_is_resumed_never_confirmed(tmp_path, cli_env):
    """Every 4 steps all ranks evaluate for 3 s (nothing in flight: no alarm), then rank 0 checkpoints for 3 s
    while the others wait in a barrier: suspected once (floor 1.5 s), resumed after ~3 s; the threshold then
    adapts (3 x 3 s), so the second checkpoint raises nothing. Exit 0, no confirmed hang."""
    done, dumps = run_job(tmp_path, cli_env, ["--suspect-floor", "1.5", "--hang-timeout", "60", "--dump-on-exit"],
                          ["--scenario", "pause", "--pause", "3", "--every", "4", "--steps", "9"], nproc=3)
    out = done.stdout
    assert done.returncode == 0, (out[-3000:], done.stderr[-3000:])
    assert done.leftover == []
    assert out.count("distdoctor run: HANG SUSPECTED") == 1, out[-4000:]
    assert "HANG CONFIRMED" not in out
    resumed = [ln for ln in out.splitlines() if ln.startswith("distdoctor run: resumed after")]
    assert len(resumed) == 1, out[-4000:]
    secs = float(resumed[0].split("resumed after ")[1].split(" s")[0])
    assert 1.5 <= secs <= 30, resumed
    assert "distdoctor run: the job ended with exit code 0." in out
    # --dump-on-exit: every rank dumped at destroy_process_group, the resumed episode in its header
    traces = [loads((dumps / f"rank_{r}.jsonl").read_text()) for r in range(3)]
    assert {t.dump_reason for t in traces} == {"exit: normal exit (destroy_process_group)"}
    assert all(t.hang["status"] == "resumed" for t in traces), [t.hang for t in traces]
    assert hidden_left(dumps) == []


def test_crash_is_named_and_never_ok(tmp_path, cli_env):
    done, dumps = run_job(tmp_path, cli_env, [], ["--scenario", "crash", "--at", "3"], nproc=2)
    out = done.stdout
    assert done.returncode != 0
    assert done.leftover == []
    assert "verdict: OK" not in out, out[-3000:]
    closing = [ln for ln in out.splitlines() if ln.startswith("distdoctor run: the job failed")]
    assert closing and "rank 1 crashed: ValueError: bad batch at step 3" in closing[0], out[-3000:]
    assert f"the command exited with code {done.returncode}" in closing[0]
    # the crashed rank's dump carries the exception, in dump_reason and in the header
    rank1 = loads((dumps / "rank_1.jsonl").read_text())
    assert rank1.dump_reason == "exception: ValueError: bad batch at step 3"
    assert rank1.exception["type"] == "ValueError" and rank1.exception["message"] == "bad batch at step 3"
    assert "manual_loop" in rank1.exception["where"] and rank1.exception["exit_code"] == 1
    # its neighbours, failed by gloo or stopped by torchrun, each kept a dump (none lost to a SIGTERM mid-dump)
    assert all((dumps / f"rank_{r}.jsonl").exists() for r in range(2)), os.listdir(dumps)
    assert hidden_left(dumps) == []


def test_ranks_left_by_a_killed_launcher_are_stopped(tmp_path, cli_env):
    """torchrun killed outright (SIGKILL: no cleanup) leaves its workers, each in its own session, blocked in
    the hang forever: distdoctor run stops them once the command has ended."""
    dumps = tmp_path / "dumps"
    cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), "--suspect-floor", "1", "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(JOB), "--scenario", "sleep", "--at", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(cli_env, OMP_NUM_THREADS="1"), start_new_session=True)
    try:
        while "HANG SUSPECTED" not in proc.stdout.readline():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
        torchrun = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == proc.pid]
        assert len(torchrun) == 1
        os.kill(torchrun[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        orphans = kill_job_processes(dumps)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert orphans == [], f"ranks outlived distdoctor run: {orphans}"
    assert "ranks 0, 1 still running after the command ended (its launcher is gone): stopping them" in err, err
    assert proc.returncode == 128 + signal.SIGKILL


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1
