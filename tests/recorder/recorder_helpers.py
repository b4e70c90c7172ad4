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


def as_foreground() -> None:
    """preexec_fn: the ranks start as a terminal's foreground job does, Ctrl-C raising KeyboardInterrupt. A shell
    starts a background command (`bash .ci/run &`, nohup) with SIGINT ignored, every process below inherits that,
    and Python then installs no KeyboardInterrupt handler: a Ctrl-C drill would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
                                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                               preexec_fn=as_foreground))

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


def kill_job_processes(dump_dir) -> list[int]:
    """Kill every process that still has this job's DISTDOCTOR_DUMP_DIR in its environment; returns their pids.
    torchrun starts each worker in its own session, so a process-group kill does not reach them: this is how a
    test makes sure no rank of its job outlives it (and can assert that none had to be killed)."""
    needle = f"DISTDOCTOR_DUMP_DIR={dump_dir}\0".encode()
    killed = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                found = needle in f.read() + b"\0"
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except OSError:
            continue
        if found and not zombie and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
            except OSError:
                pass
    return killed
