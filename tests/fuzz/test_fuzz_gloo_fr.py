"""Flight Recorder over Gloo records no send/recv: a job that only sends and receives (a pipeline) leaves dumps
with no call in them, whether it ran, hung or crashed. Such dumps never read `ok` (analyze.py, `no_calls`): the
verdict is `undecided` and says why, or a finding where the dumps do show one (a rank that left none).

Over generated pipelines (trace_sets.py: p2p chains between neighbouring stages, micro-batches, a fault on one
rank) written as Gloo's Flight Recorder writes them, and over a real run's dumps kept as a fixture (fuzz/jobs.py's
`pipeline` under `distdoctor run --inject hang:1@step=3`, 4 ranks over gloo: every rank dumped, none recorded a call).
"""

from __future__ import annotations

import tempfile

from hypothesis import assume, given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.report.diagnose_text import render_text
from distdoctor.trace.loaders import load_traces

from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import Job, Step, ground_truth, run, traces, write


@st.composite
def pipelines(draw, faults=("none", "stop", "crash", "skip", "no_dump")) -> Job:
    """A pipeline schedule: each micro-batch goes forward from stage 0 to the last, and its gradient back; one rank
    may carry a fault at one of its steps."""
    world = draw(st.integers(2, 6))
    steps = []
    for _ in range(draw(st.integers(1, 3))):  # micro-batches
        steps += [Step("0", "p2p", 8, src=r, dst=r + 1) for r in range(world - 1)]
        steps += [Step("0", "p2p", 8, src=r + 1, dst=r) for r in reversed(range(world - 1))]
    rank = draw(st.integers(0, world - 1))
    fault = draw(st.sampled_from(faults))
    chosen = {} if fault == "none" else {rank: (fault, draw(st.integers(0, len(steps) - 1)))}
    return Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, chosen, draw(st.booleans()))


def _diagnose_gloo_fr(job: Job, form: str):
    ran = run(job)
    ts_in = traces(job, ran)
    assume(ts_in)
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, {r: form for r in ts_in}, p2p=False)
        ts = load_traces([d], world_size=job.world)
    assert ts.errors == [], ts.errors
    return ran, analyze(ts)


@CHECKS
@given(pipelines(), st.sampled_from(["pickle", "json"]))
def test_a_pipelines_gloo_flight_recorder_dumps_never_read_ok(job, form):
    ran, report = _diagnose_gloo_fr(job, form)
    blocked, crashed = ground_truth(job, ran)
    assert report.verdict != "ok", (job.faults, blocked, crashed)
    if report.verdict == "undecided":  # says why, and names no rank as the culprit
        assert report.findings == []
        assert "record no send/recv" in report.undecided and "one of ranks" in report.undecided
        text = render_text(report)
        assert text.startswith("verdict: UNDECIDED") and "No desync, hang or straggler" not in text
    lost = [r for r, (fault, _) in job.faults.items() if fault == "no_dump"]
    if lost:  # what the dumps do show is said: the rank that left none
        assert report.verdict == "problem" and report.findings[0].ranks == lost


@CHECKS
@given(pipelines(faults=("none",)))
def test_the_same_pipeline_in_the_recorders_traces_is_judged(job):
    """The rule is about dumps with nothing in them, not about pipelines: where the traces hold the sends and
    receives, a healthy pipeline is ok."""
    ran = run(job)
    with tempfile.TemporaryDirectory() as d:
        write(d, job, traces(job, ran), {})
        report = analyze(load_traces([d]))
    assert report.verdict == "ok", [f.detail for f in report.findings]


def test_a_real_pipeline_hang_over_gloo_is_not_ok_from_flight_recorders_dumps():
    assert truth("gloo-fr-pipeline-hang")["kind"] == "hang"  # the run hung: rank 1 slept at step 3
    for pattern in ("rank_*.fr.pkl", "json/rank_*.fr.json"):
        rc, doc = diagnose_form("gloo-fr-pipeline-hang", pattern, 4)
        assert rc == 1
        assert doc["verdict"] == "undecided" and doc["findings"] == []
        assert "one of ranks 0-3" in doc["undecided"], doc["undecided"]
