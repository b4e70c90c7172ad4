import os
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

# Worker processes and CLI subprocesses must import this checkout's distdoctor, not another install.
if SRC not in sys.path:
    sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = SRC + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")


@pytest.fixture
def cli_env():
    """Environment for running `python -m distdoctor` in a subprocess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
