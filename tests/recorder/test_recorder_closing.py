"""`run`'s closing line: the culprit of the verdict, never a rank that only failed after the hang was seen (such a
rank cannot have caused it: the verdict printed while the job hung keeps the line)."""

from __future__ import annotations

from distdoctor.findings.kinds import Finding
from distdoctor.recorder.run_watch import JobWatch, _culprit


def watch_with(headers: dict, live, closing) -> JobWatch:
    w = JobWatch("/nonexistent", None, False, lambda m: None, lambda m, nl=True: None)
    w.headers, w.hung_verdict, w.last_findings = headers, live, closing
    return w


def test_a_crash_after_the_hang_was_seen_does_not_take_the_closing_line():
    stopped = Finding("missing_ranks", [0], group="0", seq=6, op="all_reduce")
    late = Finding("crashed", [1], group="0", seq=6, op="all_reduce")
    headers = {0: {"dump_time": 105.0}, 1: {"dump_time": 130.0, "exception": {"type": "ValueError",
                                                                              "message": "step failed"}}}
    w = watch_with(headers, (120.0, [stopped]), [late, stopped])
    assert w._closing_first() is stopped
    assert _culprit(w._closing_first(), {1: headers[1]}).startswith("rank 0: missing ranks at all_reduce #6")


def test_a_crash_before_the_hang_keeps_the_closing_verdict():
    crashed = Finding("crashed", [2], group="0", seq=3, op="all_reduce")
    w = watch_with({2: {"dump_time": 90.0}}, (120.0, [Finding("missing_ranks", [2], group="0", seq=3)]), [crashed])
    assert w._closing_first() is crashed
    assert watch_with({}, None, [crashed])._closing_first() is crashed  # no hang printed: the closing verdict


def _closing_line_of(fixture: str) -> str:
    """`run`'s closing line for a real run's dumps kept as a fixture (tests/fixtures), the launcher's log with them
    where the run kept one (run writes it beside the dumps when the job failed: recorder/console.py)."""
    from pathlib import Path

    from distdoctor.diagnose.analyze import analyze
    from distdoctor.trace.loaders import load_traces

    ts = load_traces([str(Path(__file__).resolve().parents[1] / "fixtures" / fixture)], world_size=4)
    return _culprit(analyze(ts).findings[0], {}, ts.launch)


def test_a_verdict_that_cannot_decide_is_no_claim_in_the_closing_line():
    # a tensor-parallel rank resized its group's first all_reduce; its one peer was aborted and left no dump
    assert _closing_line_of("gloo-tp-resize-first-lost").startswith("one of ranks 0, 2: size mismatch")


def test_the_closing_line_says_how_the_launcher_saw_the_culprit_end():
    assert _closing_line_of("gloo-pipeline-exit-log") == "rank 2: crashed (exit code 3, says the launcher's log)"
    assert _closing_line_of("gloo-pipeline-sigterm-log").endswith("(ended by SIGTERM, says the launcher's log)")
