"""Stragglers found the same way run after run, from real 4-rank jobs: a rank 150 ms late before every step is
named every time (at DDP's gradient buckets, from Flight Recorder's dump, and at a manual loop's gradient
all_reduce followed by a synchronized metrics all_reduce, from the recorder's own dump); a healthy job never."""

from __future__ import annotations

import pytest

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces

pytestmark = pytest.mark.slow


def _run(ranks_factory, tmp_path, late_ms: int, round_: int):
    dumps = tmp_path / "dumps"
    for old in dumps.glob("rank_*"):
        old.unlink()
    job = ranks_factory("straggler_job.py", 4, env={"LATE_MS": str(late_ms)})
    assert job.wait(timeout=180) == [0, 0, 0, 0], [job.output(r)[-2000:] for r in range(4)]
    fr = analyze(load_traces(sorted(str(p) for p in dumps.glob("rank_*.fr.pkl"))))
    native = analyze(load_traces(sorted(str(p) for p in dumps.glob("rank_*.jsonl"))))
    return fr, native


def _stragglers(report):
    return [(f.kind, f.ranks) for f in report.findings]


def test_straggler_found_every_run_and_healthy_never(ranks_factory, tmp_path):
    for round_ in range(3):
        fr, native = _run(ranks_factory, tmp_path, 150, round_)
        for report in (fr, native):
            assert _stragglers(report) == [("straggler", [1])], (round_, [f.detail for f in report.findings])
            f = report.findings[0]
            assert 90 <= f.evidence["late_ms"] <= 400, f.detail
            assert f.evidence["step_share"] and f.evidence["step_share"] > 0.3, f.detail
            assert "ms late" in f.detail and "% of a" in f.detail
        # Flight Recorder saw DDP's gradient buckets: that is where rank 1 was late
        assert fr.findings[0].op == "all_reduce"
    for round_ in range(2):
        fr, native = _run(ranks_factory, tmp_path, 0, round_)
        assert fr.findings == [] and native.findings == [], (
            [f.detail for f in fr.findings], [f.detail for f in native.findings])
