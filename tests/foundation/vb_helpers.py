"""Helpers for the validate/bench tests: run the CLI in its own process group, always under a timeout."""

import json
import os
import sys

from procs import SESSION, live_processes, run_in_session


def run_cli(*args, timeout=240):
    """Run `python -m distdoctor ARGS`; every run, passing or failing, must leave no process behind."""
    done = run_in_session([sys.executable, "-m", "distdoctor", *map(str, args)], timeout, dict(os.environ))
    if done.leftover:
        raise AssertionError(f"distdoctor {' '.join(map(str, args))} left processes behind: {done.leftover}")
    return done.returncode, done.stdout, done.stderr


def session_members(sid: int) -> list[int]:
    """Live processes in session `sid` (the CLI ran as a session leader, so its workers are in it too)."""
    return live_processes(SESSION, sid)


def run_json(*args, timeout=240):
    code, out, err = run_cli(*args, "--format", "json", timeout=timeout)
    try:
        doc = json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(f"stdout is not one JSON document (rc={code}):\n{out[-2000:]}\n{err[-3000:]}")
    return code, doc, err


def no_leftover_workers() -> list[str]:
    """Worker processes of ours still alive after an in-process run_job (multiprocessing's resource
    tracker is a helper of this test process, not a worker)."""
    me, left = os.getpid(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me and fields[0] not in ("Z", "X") and "resource_tracker" not in cmd:
            left.append(f"{pid}: {cmd[:120]}")
    return left
