"""Start-up is not a hang (recorder/hangwatch.py): real 2-rank gloo jobs under `distdoctor run --kill-on-hang`
whose ranks build their model for longer than --hang-timeout after init_process_group — every rank with no
collective issued yet, then rank 1 while rank 0 waits in the first all_reduce — as on a loaded host. The slow job
runs to its end (exit 0, no hang confirmed); a rank that never reaches its first collective is still caught,
after --start-timeout, reported as a hang during start-up that names it, and the job is stopped. Both jobs run
at once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from procs import PGRP, live_processes
from recorder_helpers import free_port, kill_job_processes

pytestmark = pytest.mark.slow

WORKER = Path(__file__).resolve().parent / "workers" / "slow_start.py"


def start(tmp_path: Path, name: str, cli_env: dict, run_args: list[str], job_args: list[str]):
    import subprocess

    dumps = tmp_path / name
    cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), "--suspect-floor", "1",
           "--hang-timeout", "3", "--kill-on-hang", "--kill-grace", "5", *run_args, "--", sys.executable, "-m",
           "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
           str(free_port()), str(WORKER), *job_args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(cli_env, OMP_NUM_THREADS="1"))
    return proc, dumps


def finish(proc, dumps: Path, timeout: float):
    import os
    import signal
    import subprocess

    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        kill_job_processes(dumps)
        raise
    leftover = live_processes(PGRP, proc.pid) + kill_job_processes(dumps)
    return proc.returncode, out, err, leftover


def test_slow_start_up_is_no_hang_and_a_rank_that_never_starts_is_caught(tmp_path, cli_env):
    slow = start(tmp_path, "slow", cli_env, [], ["5", "5"])  # 5 s idle, then rank 0 waits 5 s in all_reduce #1
    stuck = start(tmp_path, "stuck", cli_env, ["--start-timeout", "10"], ["1", "-1"])
    rc, out, err, leftover = finish(*slow, timeout=180)
    assert rc == 0 and "HANG" not in out and leftover == [], (rc, out[-3000:], err[-3000:])
    assert "rank 0 done" in out + err and "rank 1 done" in out + err
    rc, out, err, leftover = finish(*stuck, timeout=180)
    assert rc != 0 and leftover == [], (rc, leftover, err[-3000:])
    lines = out.splitlines()
    confirmed = next((ln for ln in lines if ln.startswith("distdoctor run: HANG CONFIRMED")), None)
    assert confirmed is not None and "DURING START-UP" in confirmed, out[-3000:]
    assert "HANG SUSPECTED" not in out, out[-3000:]
    assert "stopping the job (--kill-on-hang)" in out
    closing = next(ln for ln in lines if ln.startswith("distdoctor run: the job failed"))
    assert closing.startswith("distdoctor run: the job failed: rank 1"), closing
