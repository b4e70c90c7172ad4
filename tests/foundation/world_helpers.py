"""Helpers for the world tests: children of this process, and subprocesses that never outlive a test."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from procs import PPID, PGRP, live_processes

HERE = str(Path(__file__).resolve().parent)


def job_env() -> dict:
    """Environment in which workers (also torchrun's) can import world_jobs and this checkout's distdoctor."""
    env = dict(os.environ)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        env.pop(key, None)
    return env


def children(pid: int | None = None) -> list[int]:
    """Live (non-zombie) processes whose parent is `pid` (default: this process), from /proc."""
    return live_processes(PPID, os.getpid() if pid is None else pid)


def in_group(pgid: int) -> list[int]:
    """Live processes of a process group, from /proc."""
    return live_processes(PGRP, pgid)


def run(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run in a new session; on timeout kill the whole process group (no worker left behind).

    The result's `leftover` lists the processes of the command's group still alive after it exited (the
    command's own workers, not yet killed): a test asserts it is empty."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or job_env(),
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(cmd)} timed out after {timeout} s; stderr tail:\n{err[-3000:]}")
    else:
        leftover = in_group(proc.pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # anything the command left in its group
        except ProcessLookupError:
            pass
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    done.leftover = leftover
    return done


def distdoctor(*args, timeout: float = 180) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "distdoctor", *map(str, args)], timeout)
