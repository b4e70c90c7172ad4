"""The rules the real-library suite (tests/doctor/real) taught the doctor, each over generated trace sets
(trace_sets.py), so each holds for every shape of job and not only for the one that showed it.

Each test names the module whose docstring states its rule.
"""

from __future__ import annotations

from hypothesis import given
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
