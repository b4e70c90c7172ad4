"""Live across hosts (`distdoctor run` on each of two virtual hosts, each with its own dump directory: no shared
file system): one rank on host1 stops; the `run` on host0 (global rank 0's host) reads every rank's state through
torch's worker servers registered in the job's store and names exactly that rank — stopped outside collectives,
or holding the GIL (then with the stack py-spy read) — within 20 s of the stop."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mh_helpers import torchrun_argv, wait_for

WORKER = str(Path(__file__).parent / "workers" / "live_stop.py")
BOUND_S = 20.0

pytestmark = [pytest.mark.slow, pytest.mark.netns]


class Lines:
    """A process's stdout, each line with the time it arrived."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def first(self, prefix: str):
        return next(((t, ln) for t, ln in self.lines if ln.startswith(prefix)), None)

    def text(self) -> str:
        return "\n".join(ln for _, ln in self.lines)


def run_stopping_job(cluster, tmp_path, mode: str) -> tuple[float, float, str, str]:
    """Start the job under `distdoctor run` on both hosts, rank 3 (host1) stops; returns (stop time, verdict
    time, host0's stdout, everything for the failure message)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", GLOO_SOCKET_IFNAME=cluster.hosts[0].iface, STOP_MODE=mode,
               STOP_RANK="3", STOP_AT="60", OMP_NUM_THREADS="1")
    procs, outs, errs = [], [], []
    for h in (0, 1):
        argv = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(tmp_path / f"host{h}"), "--",
                *torchrun_argv(cluster, h, 2, [WORKER])]
        err = open(tmp_path / f"host{h}.err", "w")
        proc = cluster.popen(h, argv, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        procs.append(proc)
        outs.append(Lines(proc))
        errs.append(tmp_path / f"host{h}.err")

    def log() -> str:
        return "\n".join(f"--- host{h} stdout\n{outs[h].text()}\n--- host{h} stderr\n{errs[h].read_text()[-4000:]}"
                         for h in (0, 1))

    try:
        assert wait_for(lambda: outs[1].first("STOP") is not None or any(p.poll() is not None for p in procs), 240), \
            log()
        stop = outs[1].first("STOP")
        assert stop is not None, log()
        t_stop = float(stop[1].split()[1])
        wait_for(lambda: outs[0].first("distdoctor run: HANG SUSPECTED") is not None, 60)
        time.sleep(3)  # the report after the header line
        verdict = outs[0].first("distdoctor run: HANG SUSPECTED")
        assert verdict is not None, log()
        return t_stop, verdict[0], outs[0].text(), log()
    finally:
        for h in (0, 1):
            cluster.kill_host(h)
        for p in procs:
            p.wait(30)


def test_rank_stopped_outside_collectives_on_the_other_host_is_named(cluster, tmp_path):
    t_stop, t_verdict, out, log = run_stopping_job(cluster, tmp_path, "sleep")
    assert t_verdict - t_stop <= BOUND_S, (t_verdict - t_stop, log)
    assert "missing_dump" not in out, log  # no rank is taken for dead: each answered live
    finding = next(ln for ln in out.splitlines() if ln.startswith("1. "))
    assert finding.startswith("1. missing_ranks: ranks [3] at all_reduce"), log
    assert "wait_for_the_next_batch" in out and "live_stop.py" in out, log  # rank 3's own stack, from host1


@pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed (pip install py-spy)")
def test_rank_holding_the_gil_on_the_other_host_is_named_with_its_stack(cluster, tmp_path):
    t_stop, t_verdict, out, log = run_stopping_job(cluster, tmp_path, "gil")
    assert t_verdict - t_stop <= BOUND_S, (t_verdict - t_stop, log)
    finding = next(ln for ln in out.splitlines() if ln.startswith("1. "))
    assert finding.startswith("1. missing_ranks: ranks [3] at all_reduce"), log
    silent = next(ln for ln in out.splitlines() if ln.strip().startswith("rank 3 ("))
    assert "its Python does not answer" in silent and "py-spy" in silent, log
    assert "hold_the_gil" in out, log  # the stack py-spy read from outside the process
