"""Stragglers found the same way run after run, from real 4-rank gloo jobs: a rank 150 ms late before every step
is named in each of three runs (at DDP's gradient buckets, from Flight Recorder's dump, and at a manual loop's
gradient all_reduce followed by a synchronized metrics all_reduce, from the recorder's own dump); a healthy
run never."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces

from recorder_helpers import WORKERS, kill_group

pytestmark = pytest.mark.slow


def test_straggler_found_every_run_and_healthy_never(tmp_path, cli_env):
    late = [150, 150, 150, 0]
    proc = subprocess.Popen([sys.executable, str(WORKERS / "straggler_job.py"), str(tmp_path), *map(str, late)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=300)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, out[-3000:]
    for i, ms in enumerate(late):
        run = tmp_path / f"run_{i}"
        fr = analyze(load_traces(sorted(str(p) for p in run.glob("rank_*.fr.pkl"))))
        native = analyze(load_traces(sorted(str(p) for p in run.glob("rank_*.jsonl"))))
        for report in (fr, native):
            details = [f.detail for f in report.findings]
            if not ms:
                assert report.findings == [], (i, details)
                continue
            assert [(f.kind, f.ranks) for f in report.findings] == [("straggler", [1])], (i, details)
            f = report.findings[0]
            assert 90 <= f.evidence["late_ms"] <= 400, f.detail
            assert f.evidence["step_share"] > 0.3 and "ms late (" in f.detail and "% of a" in f.detail, f.detail
        assert all(t.dump_reason == "exit: normal exit (destroy_process_group)" for t in native.traces.ranks.values())
