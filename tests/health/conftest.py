import subprocess
import sys

import pytest

from procs import run_in_session


def run_cmd(args: list[str], timeout: float = 180, env=None) -> subprocess.CompletedProcess:
    """Run a command in its own session; kill the whole group if it overruns (procs.run_in_session)."""
    return run_in_session(args, timeout, env)


@pytest.fixture
def run():
    return run_cmd


@pytest.fixture
def python():
    return sys.executable
