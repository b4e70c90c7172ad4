"""Helpers for the world tests: children of this process, and subprocesses that never outlive a test."""

import os
import subprocess
import sys
from pathlib import Path

from procs import PGRP, PPID, live_processes, run_in_session

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
    """Run in a new session with the job environment (see procs.run_in_session: `leftover`, group killed)."""
    return run_in_session(cmd, timeout, env or job_env())


def distdoctor(*args, timeout: float = 180) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "distdoctor", *map(str, args)], timeout)
