import os
import signal
import subprocess
import sys
import textwrap

import pytest

from distdoctor.sim.ir import parse_text
from distdoctor.sim.result import simulate


@pytest.fixture
def sim_yaml():
    """Simulate a YAML program given as (indented) text; returns the JSON report dict."""

    def run(text: str, name: str = "plan.yaml", detail: bool = False):
        return simulate(parse_text(textwrap.dedent(text), name), detail=detail)

    return run


@pytest.fixture
def sim_cli(cli_env):
    """Run `python -m distdoctor sim ...` in its own process group; killed with the group on timeout."""

    def run(*args, timeout: float = 120, cwd=None):
        proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "sim", *map(str, args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env,
                                cwd=cwd, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    return run
