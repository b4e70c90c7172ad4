"""Helpers for the recorder tests: launch real gloo ranks as plain subprocesses (each in its own session) and
always kill them with their process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


class Ranks:
    """N worker processes running one script; `wait()` returns their exit codes or fails after a timeout."""

    def __init__(self, script: str, nranks: int, dump_dir: Path, env: dict | None = None, args=()):
        port = free_port()
        self.procs = []
        self.logs = []
        for rank in range(nranks):
            penv = dict(os.environ)
            penv.update({"RANK": str(rank), "WORLD_SIZE": str(nranks), "MASTER_ADDR": "127.0.0.1",
                         "MASTER_PORT": str(port), "DISTDOCTOR_DUMP_DIR": str(dump_dir),
                         "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
            penv.update(env or {})
            log = open(dump_dir.parent / f"{Path(script).stem}-rank{rank}.log", "w+")
            self.logs.append(log)
            self.procs.append(subprocess.Popen([sys.executable, str(WORKERS / script), *args], env=penv,
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def output(self, rank: int) -> str:
        self.logs[rank].flush()
        self.logs[rank].seek(0)
        return self.logs[rank].read()

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for rank, p in enumerate(self.procs):
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"rank {rank} did not finish within {timeout} s:\n" + self.output(rank)[-3000:])
        return codes

    def kill(self) -> None:
        for p in self.procs:
            kill_group(p)


def poll_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")
