"""Helpers for the multi-host tests: run a command on several virtual hosts at once, torchrun lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from distdoctor.testing import netns

MASTER_PORT = 29400  # each cluster has its own namespaces, so a fixed port never collides

# name -> fn(cluster, tmp_path) -> outcome; run side by side by conftest's `scenarios` fixture.
SCENARIOS: dict[str, Callable] = {}


def scenario(fn: Callable) -> Callable:
    """Register a multi-host scenario under its function name (without leading underscores). Register the
    longest first: they start in registration order."""
    SCENARIOS[fn.__name__.lstrip("_")] = fn
    return fn


@dataclass
class NodeResult:
    host: int
    argv: list[str]
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    elapsed_s: float = 0.0
    timed_out: bool = False

    def text(self) -> str:
        return f"--- host{self.host} rc={self.returncode} {self.elapsed_s:.1f}s\n{self.stdout}\n{self.stderr}"


@dataclass
class Job:
    """Processes started on several hosts at once; output collected concurrently (no pipe can fill up)."""

    cluster: netns.VirtualCluster
    results: list[NodeResult] = field(default_factory=list)
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _t0: float = 0.0

    def start(self, argvs: dict[int, list[str]], env: dict[str, str] | None = None) -> "Job":
        self._t0 = time.monotonic()
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        for host, argv in argvs.items():
            res = NodeResult(host, argv)
            proc = self.cluster.popen(host, argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
            t = threading.Thread(target=self._collect, args=(proc, res), daemon=True)
            t.start()
            self.results.append(res)
            self._procs.append(proc)
            self._threads.append(t)
        return self

    def _collect(self, proc: subprocess.Popen, res: NodeResult) -> None:
        res.stdout, res.stderr = proc.communicate()
        res.returncode = proc.returncode
        res.elapsed_s = time.monotonic() - self._t0

    def wait(self, timeout: float, hosts: list[int] | None = None) -> list[NodeResult]:
        """Wait for the given hosts' processes (all by default); kill what is still running at the deadline."""
        deadline = self._t0 + timeout
        for proc, res, t in zip(self._procs, self.results, self._threads):
            if hosts is not None and res.host not in hosts:
                continue
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                res.timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.cluster.kill_host(res.host)
                t.join(10)
        return [r for r in self.results if hosts is None or r.host in hosts]

    def log(self) -> str:
        return "\n".join(r.text() for r in self.results)


def torchrun_argv(c: netns.VirtualCluster, host: int, nproc: int, program: list[str], *,
                  launcher: list[str] | None = None) -> list[str]:
    """`python -m torch.distributed.run --nnodes H --node-rank K ... <program>` for one host of the cluster."""
    return [*(launcher or []), sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(c.hosts)),
            "--node-rank", str(host), "--nproc-per-node", str(nproc), "--master-addr", c.hosts[0].addr,
            "--master-port", str(MASTER_PORT), "--max-restarts", "0", "--monitor-interval", "0.5", *program]


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
