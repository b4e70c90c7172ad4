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


def test_a_file_reached_twice_is_read_once(tmp_path):
    """By a link to it (glog's prog.INFO), through a linked directory, or named twice: read once, under the
    first name in path order; files of the same name in other directories stay apart."""
    from distdoctor.trace.loaders import expand_paths

    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    for d in ("a/b", "c"):
        (tmp_path / d / "rank_0").write_bytes(b"x")
    (tmp_path / "a" / "b" / "latest").symlink_to("rank_0")
    (tmp_path / "linked").symlink_to(tmp_path / "a")
    files, errors = expand_paths([str(tmp_path / "a"), str(tmp_path / "linked" / "b" / "rank_0"),
                                  str(tmp_path / "c"), str(tmp_path / "a" / "b" / ".." / "b" / "rank_0")])
    assert files == [str(tmp_path / "a" / "b" / "latest"), str(tmp_path / "c" / "rank_0")] and not errors
