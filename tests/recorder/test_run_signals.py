"""`distdoctor run` and signals from outside a terminal: `kill -INT` to run alone reaches the job (a terminal's
Ctrl-C reaches both and is not sent twice); after run itself is SIGKILLed, together with its job, the pid files
and the dump request left in the dump directory are removed by the next run there before its job starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from recorder_helpers import free_port, kill_group

# A one-rank gloo job: it creates a process group (so the recorder registers the rank's pid) and waits.
ONE_RANK = """
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
print("ready", flush=True)
if os.environ.get("READY_FILE"):  # past init_process_group (and the recorder's start-up inside it)
    open(os.environ["READY_FILE"], "w").close()
try:
    time.sleep(120)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


def _start(dumps, env, script):
    return subprocess.Popen([sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), "--",
                             sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)  # a session of its own: no terminal


def _wait_for(path, proc, timeout=90):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def test_kill_int_to_run_alone_reaches_the_job(tmp_path, cli_env):
    dumps = tmp_path / "d"
    # The job's own "ready", not the recorder's pid file: that is written while init_process_group is still
    # starting the recorder, where a Ctrl-C would land before the job's try.
    proc = _start(dumps, {**cli_env, "READY_FILE": str(tmp_path / "ready")}, ONE_RANK % free_port())
    try:
        _wait_for(tmp_path / "ready", proc)
        os.kill(proc.pid, signal.SIGINT)  # run alone, as `kill -INT <pid>` from another shell or a script
        out, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert "interrupted" in out, (out, err)
    assert proc.returncode == 130, (proc.returncode, err[-2000:])
    assert not (dumps / ".rank_0.pid").exists()


def test_the_next_run_removes_what_a_sigkilled_run_left(tmp_path, cli_env):
    dumps = tmp_path / "d"
    proc = _start(dumps, cli_env, ONE_RANK % free_port())
    try:
        _wait_for(dumps / ".rank_0.pid", proc)
        (dumps / ".request.json").write_text('{"id": "x", "status": "suspected", "ranks": [0]}')  # a fan-out's
    finally:
        kill_group(proc)  # run and its job, SIGKILL: nobody can clean up
    assert (dumps / ".rank_0.pid").exists()
    # Before the next job starts, not only after it: a stale pid file would have SIGUSR1 sent to whatever
    # process has that pid now, and a stale request would be taken for the new job's.
    look = f"import os; print(sorted(n for n in os.listdir({str(dumps)!r}) if n.startswith('.')))"
    again = subprocess.run([sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), "--",
                            sys.executable, "-c", look], capture_output=True, text=True, timeout=60, env=cli_env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "[]", again.stdout
    assert sorted(p.name for p in dumps.iterdir() if p.name.startswith(".")) == [], list(dumps.iterdir())
