"""Helpers for the validate/bench tests: run the CLI in its own process group, always under a timeout."""

import json
import os
import signal
import subprocess
import sys


def run_cli(*args, timeout=240):
    """Run `python -m distdoctor ARGS`; on timeout kill the whole process group (no worker left behind)."""
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=dict(os.environ))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"distdoctor {' '.join(map(str, args))} timed out; stderr tail:\n{err[-3000:]}")
    return proc.returncode, out, err


def run_json(*args, timeout=240):
    code, out, err = run_cli(*args, "--format", "json", timeout=timeout)
    try:
        doc = json.loads(out)
    except json.JSONDecodeError:
        raise AssertionError(f"stdout is not one JSON document (rc={code}):\n{out[-2000:]}\n{err[-3000:]}")
    return code, doc, err


def no_leftover_workers(marker: str = "distdoctor") -> list[str]:
    """Processes of ours still alive after a run (children of this test process)."""
    me = os.getpid()
    left = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == me and fields[0] not in ("Z", "X"):
                left.append(pid)
        except (OSError, IndexError, ValueError):
            continue
    return left
