import os
import signal
import subprocess
import sys

import pytest


def run_cmd(args: list[str], timeout: float = 180, env=None) -> subprocess.CompletedProcess:
    """Run a command in its own process group; kill the whole group if it overruns."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{args} timed out after {timeout}s\nstdout:\n{out}\nstderr:\n{err[-4000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.fixture
def run():
    return run_cmd


@pytest.fixture
def python():
    return sys.executable
