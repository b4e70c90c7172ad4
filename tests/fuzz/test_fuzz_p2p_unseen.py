"""Pipelines whose ranks left different forms of dump, one rank having exited mid-way with its process group
alive. Gloo's Flight Recorder records no send/recv: an empty Gloo dump is absence of evidence for p2p, not a rank
that never posted its half. A real pipeline run (rank 0 exited at a step; ranks 1, 2 left Gloo's dumps, 0 and 3
the recorder's) read `missing_ranks [2]`, a false claim, because rank 3 waited in a recv from rank 2. The rank
that left is named, or the verdict says "one of ranks ..." with it among them; never another rank alone. Over
generated jobs (trace_sets.py)."""

from __future__ import annotations

import tempfile

from hypothesis import given

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces
from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import left_alive, pipeline_left, run, traces, write


@CHECKS
@given(pipeline_left())
def test_a_rank_whose_dump_cannot_show_p2p_is_never_blamed_alone(case):
    job, left, forms = case
    ts_in = traces(job, run(job))
    ts_in[left] = left_alive(ts_in[left])
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, forms, p2p=False)
        ts = load_traces([d])
    report = analyze(ts)
    got = [(f.kind, f.ranks, f.detail[:160]) for f in report.findings]
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [left]], got  # a false claim
    if report.findings:
        first = report.findings[0]
        assert first.ranks == [left] or (first.detail.startswith("one of") and left in first.ranks), got


def test_the_real_pipeline_run_names_the_rank_that_exited_in_its_mix_of_forms():
    """The run itself: a 4-rank pipeline, rank 0 exited with code 3 at a step; ranks 0 and 3 left the recorder's
    traces, 1 and 2 Gloo's Flight Recorder dumps, empty (`tests/fixtures/gloo-pipeline-exit-mixed`)."""
    fired = truth("gloo-pipeline-exit-mixed")
    _, report = diagnose_form("gloo-pipeline-exit-mixed", "rank_*", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [fired["rank"]]), report["findings"]
    assert "exited with its process group alive" in first["detail"], first["detail"]
    assert not [f for f in report["findings"] if f["ranks"] in ([1], [2])], report["findings"]
