"""`diagnose DIR` and `lint DIR` where each rank's files sit in a subdirectory of DIR (logs/rank_0/..., as OneFlow
and many launchers write them): read without --recursive, and stderr says so. A directory whose own files are
traces is still read alone (a subdirectory there may be an older run)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "fuzz" / "data"  # real Flight Recorder dumps of a 2-rank gloo job
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "distdoctor", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})


@pytest.fixture
def nested(tmp_path) -> Path:
    logs = tmp_path / "logs"
    for r in (0, 1):
        (logs / f"rank_{r}").mkdir(parents=True)
        shutil.copy(DATA / f"fr_pickle_rank_{r}", logs / f"rank_{r}" / f"fr_pickle_rank_{r}")
    return logs


@pytest.mark.parametrize("command", ["diagnose", "lint"])
def test_ranks_in_subdirectories_are_read_and_said(nested, command):
    out = _cli(command, nested, "--format", "json")
    assert out.returncode in (0, 1), out.stderr
    doc = json.loads(out.stdout)
    assert "read its subdirectories (2 rank trace(s) there)" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert doc["world_size"] == 2 and doc["load_errors"] == []
    loaded = doc["ranks"] if command == "diagnose" else doc["ranks_loaded"]
    assert len(loaded) == 2, loaded


def test_own_traces_are_not_mixed_with_a_subdirectory(nested):
    shutil.copy(DATA / "fr_pickle_rank_0", nested / "fr_pickle_rank_0")
    out = _cli("diagnose", nested)
    assert "read its subdirectories" not in out.stderr
    assert "--recursive reads them" in out.stderr, out.stderr
