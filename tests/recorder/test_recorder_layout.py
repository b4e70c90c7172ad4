"""`distdoctor run --dump-layout host`: each host's dumps in DUMP_DIR/host-<name>/, found by run's own summary
and clean-up and by `diagnose DIR` without --recursive; the flat layout unchanged."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from distdoctor.recorder import layout
from distdoctor.trace.loaders import SUBDIR_NOT_READ, expand_paths, load_traces
from distdoctor.trace.model import loads

from recorder_helpers import WORKERS, free_port
from test_recorder_run import run_distdoctor


def test_layout_choice():
    assert layout.resolve(None, 16384) == "flat" and layout.resolve("flat", 16384) == "flat"
    assert layout.resolve("host", 2) == "host"
    assert layout.resolve("auto", layout.AUTO_HOST_RANKS) == "host"
    assert layout.resolve("auto", layout.AUTO_HOST_RANKS - 1) == "flat" and layout.resolve("auto", None) == "flat"
    assert layout.host_dir_name("gpu-a17.cluster") == "host-gpu-a17.cluster"
    assert layout.host_dir_name("../x y") == "host-.._x_y" and "/" not in layout.host_dir_name("a/b")


def test_both_layouts_are_found_and_diagnose_reads_host_dirs_without_recursion(tmp_path):
    (tmp_path / "rank_0.jsonl").write_text("x")
    for host, rank in (("host-a", 1), ("host-b", 2)):
        (tmp_path / host).mkdir()
        (tmp_path / host / f"rank_{rank}.jsonl").write_text("x")
        (tmp_path / host / f".rank_{rank}.pid").write_text("1\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "rank_9.jsonl").write_text("x")
    names = sorted(os.path.relpath(p, tmp_path) for p in layout.find(str(tmp_path), "rank_*.jsonl"))
    assert names == ["host-a/rank_1.jsonl", "host-b/rank_2.jsonl", "rank_0.jsonl"]
    assert len(layout.find(str(tmp_path), ".rank_*.pid")) == 2
    files, errors = expand_paths([str(tmp_path)], recursive=False)
    assert sorted(os.path.relpath(f, tmp_path) for f in files) == names  # hidden pid files are not read
    assert [(os.path.basename(e.path), e.reason) for e in errors] == [("other", SUBDIR_NOT_READ)]


@pytest.mark.slow
def test_run_writes_per_host_and_diagnose_reads_it(tmp_path, cli_env):
    dumps = tmp_path / "dumps"
    rc, _, err = run_distdoctor(["--dump-dir", str(dumps), "--dump-layout", "host", "--hang-timeout", "0", "--",
                                 sys.executable, str(WORKERS / "plain_job.py"), "single", str(free_port())],
                                timeout=120, env=cli_env)
    assert rc == 3, err
    host_dir = dumps / layout.host_dir_name(socket.gethostname())
    assert sorted(p.name for p in dumps.iterdir()) == [host_dir.name]  # nothing else at the top
    assert sorted(p.name for p in host_dir.iterdir() if not p.name.endswith(".fr.pkl")) == ["rank_0.jsonl"]
    assert os.stat(host_dir).st_mode & 0o777 == 0o700
    assert loads((host_dir / "rank_0.jsonl").read_text()).dump_reason == "exception: RuntimeError: loader died"
    assert "rank 0: exception: RuntimeError: loader died" in err  # run's summary found it
    ts = load_traces([str(dumps)], recursive=False)  # what `diagnose DIR` reads
    assert list(ts.ranks) == [0] and ts.errors == []


def test_run_cleans_up_inside_host_dirs(tmp_path, cli_env):
    """Pid files of killed ranks and torn temporary files are removed in host directories too."""
    kept = tmp_path / "kept"
    sub = kept / layout.host_dir_name(socket.gethostname())
    sub.mkdir(parents=True)
    (sub / "rank_0.jsonl").write_text("old dump\n")
    (sub / ".rank_3.pid").write_text(f"999999999\n{socket.gethostname()}\n")
    (sub / ".rank_3.jsonl.tmp-999999999-0").write_text("torn")
    rc, _, err = run_distdoctor(["--dump-dir", str(kept), "--dump-layout", "host", "--", sys.executable, "-c",
                                 "pass"], timeout=60, env=cli_env)
    assert rc == 0, err
    assert sorted(p.name for p in sub.iterdir()) == ["rank_0.jsonl"]
    assert "already holds dumps" in err  # the existing dump in the host directory was seen


def test_bad_layout_is_refused(cli_env):
    out = subprocess.run([sys.executable, "-m", "distdoctor", "run", "--dump-layout", "nested", "--", "true"],
                         capture_output=True, text=True, env=cli_env, timeout=60)
    assert out.returncode == 2 and "nested" in out.stderr and "Traceback" not in out.stderr
