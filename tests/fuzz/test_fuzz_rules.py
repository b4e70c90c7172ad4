"""The rules the real-library suite (tests/doctor/real) taught the doctor, each over generated trace sets
(trace_sets.py), so each holds for every shape of job and not only for the one that showed it.

Each test names the module whose docstring states its rule.
"""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from test_fuzz_invariant import CHECKS, _diagnose
from trace_sets import jobs


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
