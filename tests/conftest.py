import os
import sys
from pathlib import Path

import pytest

import work_units

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


# The suite on two cores (pytest-xdist; pyproject's addopts: `-n 2 --dist loadgroup`): see work_units.py.


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which appends an xdist_group to the test's id
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):  # an xdist worker (the controller collects nothing)
        work_units.mark_groups(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadgroup":
        return work_units.scheduler(config, log)
    return None
