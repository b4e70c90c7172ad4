"""Live processes from /proc, for the tests that check no process is left behind."""

from __future__ import annotations

import os
import signal
import subprocess

# Field positions in /proc/<pid>/stat after the command name: state, ppid, pgrp, session.
STATE, PPID, PGRP, SESSION = 0, 1, 2, 4


def live_processes(field: int, value: int) -> list[int]:
    """Pids of live (non-zombie) processes whose stat `field` (PPID, PGRP, SESSION) equals `value`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[field]) == value and fields[STATE] not in ("Z", "X"):
            found.append(int(entry))
    return found


def run_in_session(cmd: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `cmd` as the leader of a new session, so its workers are in its process group. On timeout kill the
    whole group and fail; after it exits, `result.leftover` lists what was still alive in the group (a test
    asserts it is empty), and the group is killed so no process outlives the test."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(map(str, cmd))} timed out after {timeout} s; stderr tail:\n{err[-3000:]}")
    leftover = live_processes(PGRP, proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    done.leftover = leftover
    return done
