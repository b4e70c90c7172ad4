import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

JOBS = Path(__file__).parent / "scenarios" / "jobs.py"


@pytest.fixture(scope="session")
def scenario_dumps(tmp_path_factory) -> dict:
    """Run every planted-fault scenario once (real 4-rank Gloo jobs, concurrently) and return
    {"dir": Path, "status": {scenario: {...}}}; dumps are in dir/<scenario>/{pickle,json,native}/ (native: the
    recorder's rank_<r>.jsonl beside its own Flight Recorder rank_<r>.fr.pkl)."""
    out = tmp_path_factory.mktemp("scenarios")
    env = dict(os.environ, DISTDOCTOR_TRACE="1")  # the recorder's native dumps too, from the same runs
    proc = subprocess.Popen([sys.executable, str(JOBS), "--out", str(out), "--deadline", "120"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("scenario jobs did not finish in 240 s")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # any rank left behind
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, stderr[-3000:]
    return {"dir": out, "status": json.loads(stdout)}


def _run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distdoctor", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


@pytest.fixture
def run_cli():
    """Run `python -m distdoctor ARGS` (this checkout's src is on PYTHONPATH via tests/conftest.py)."""
    return _run_cli
