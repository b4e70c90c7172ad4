"""The rules the real-library suite (tests/doctor/real) taught the doctor, each over generated trace sets
(trace_sets.py), so each holds for every shape of job and not only for the one that showed it.

Each test names the module whose docstring states its rule.
"""

from __future__ import annotations

import tempfile

from hypothesis import assume, example, given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces

from test_fuzz_invariant import CHECKS, _diagnose
from trace_sets import Job, Step, ground_truth, jobs, run, traces, write


@CHECKS
@given(jobs(faults=("none",), max_faults=0, late=False), st.data())
def test_a_healthy_job_is_ok_in_every_form(job, data):
    """match.py: dtypes compare as each call's distinct dtypes (a scatter's root passes n tensors, the others
    none)."""
    forms = {r: data.draw(st.sampled_from(["native", "pickle", "json", "both"])) for r in range(job.world)}
    for mix in (None, forms):
        _, _, report = _diagnose(job, mix)
        assert report.verdict == "ok", [f.detail for f in report.findings]


@CHECKS
@given(jobs(faults=("lone",), max_faults=1, late=False), st.data())
def test_a_call_only_one_rank_makes_names_that_rank(job, data):
    """waitfor.py, rank-conditional calls: a rank blocked in the first collective of a group nobody else ever
    used, while others wait for it in a group they had used before, is missing where they wait (not an order
    deadlock), in every form. (When the others also wait in their first call on a group, the dumps cannot tell a
    conditional call from a swap of first uses; nor when they wait for it only in p2p: not asserted.)"""
    assume(job.faults)
    (rank, _), = job.faults.items()
    forms = {r: data.draw(st.sampled_from(["native", "pickle", "json", "both"])) for r in range(job.world)}
    for mix in (None, forms):
        _, _, report = _diagnose(job, mix)
        waiting = [w for w in report.waits if w.rank != rank and rank in w.waits_for]
        if not any(not w.entry.is_p2p and report.views[w.entry.group].last_completed.get(w.rank, -1) >= 0
                   for w in waiting):
            return  # nobody waits for it (the others finished, or never needed it), or only in first uses
        first = report.findings[0]
        assert (first.kind, first.ranks) == ("missing_ranks", [rank]), [f.detail for f in report.findings]


@CHECKS
@given(jobs(faults=("stop", "crash", "skip", "swap", "size", "dtype", "root", "op", "lone", "no_dump"), late=False),
       st.sampled_from(["native", "pickle"]))
def test_every_finding_names_the_users_code(job, form):
    """sites.py: where a dump has frames (the recorder's call sites and stacks, Flight Recorder's pickle), every
    finding names a line of the user's code; a metadata mismatch names the line of the call the ranks disagree
    on."""
    _, _, report = _diagnose(job, {r: form for r in range(job.world)})
    for f in report.findings:
        assert any(f"{name}:" in f.detail for name in ("train.py", "data.py", "model.py")), f.detail
    if len(job.faults) == 1 and report.findings:
        (rank, (fault, at)), = job.faults.items()
        first = report.findings[0]
        if fault in ("size", "dtype", "op") and first.kind.endswith("_mismatch") and first.ranks == [rank]:
            assert f"train.py:{100 + at}" in first.detail, first.detail


def _hidden_blocked_calls(job):
    """The job's recorder traces, as if every collective a rank is blocked in had been issued from C++ (DDP's
    buckets): the trace ends before it, and only the hang header's `blocked_in` tells (no Flight Recorder dump
    given). Returns (report, ranks whose call was hidden, ground truth)."""
    ran = run(job)
    ts_in = traces(job, ran)
    assume(ts_in)
    hidden = set()
    for r, t in ts_in.items():
        last = t.entries[-1] if t.entries else None
        if last is None or last.is_p2p or last.state == "completed":
            continue
        t.entries = t.entries[:-1]
        t.hang = {"status": "suspected", "this_rank": {"blocked_in": {
            "group": last.group, "seq": last.seq, "op": f"gloo:{last.op}", "source": "flight_recorder",
            "since": last.t_created}, "blocked_for_s": 12.0}}
        hidden.add(r)
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, {})
        ts = load_traces([d])
    return analyze(ts), hidden, ground_truth(job, ran)


@CHECKS
@given(jobs(faults=("stop", "crash", "skip", "swap", "lone", "no_dump"), late=False))
# A rank waits in a send for a peer that never joined: the wait-for graph's missing_ranks finding for a p2p op
# lists waiting ranks, not p2p.py's [rank, peer] pairs (sites.py once unpacked them as pairs).
@example(Job(world=3, groups={"0": [0, 1, 2], "1": [0], "2": [0], "3": [0, 1]},
             descs={"0": "default_pg", "1": "undefined", "2": "undefined", "3": "undefined"},
             steps=[Step(group="3", op="all_reduce", size=4), Step(group="0", op="p2p", size=4, src=0, dst=2)],
             faults={1: ("stop", 0)}))
def test_a_hang_only_the_watchdog_saw_is_never_ok(job):
    """hang_status.py: ranks whose headers say they were blocked in a call their traces cannot hold (issued from
    C++) are blocked all the same: never `ok`, each accounted for; with one rank stopped, it is the culprit."""
    report, hidden, (blocked, crashed) = _hidden_blocked_calls(job)
    doc = report.to_json()
    if hidden:
        assert doc["verdict"] == "problem"
    explained = {r for f in doc["findings"] for r in f["ranks"]} | {r for c in doc["consequences"] for r in c["ranks"]}
    assert hidden <= explained, (hidden, doc["findings"], doc["consequences"])
    if len(job.faults) == 1 and hidden:
        (rank, (fault, _)), = job.faults.items()
        if fault == "stop" and rank not in blocked and rank not in hidden:
            first = report.findings[0]
            assert (first.kind, first.ranks) == ("missing_ranks", [rank]), [f.detail for f in report.findings]
