"""NCCL dump sets from the simulator (sim/fr_nccl.py), every fault class, both dump forms and both file forms:
diagnose's first finding names only faulty ranks, every faulty rank the dumps can show is named, and a healthy
set caught mid-flight has no finding. 40 sets in the suite; `python fuzz/run_fuzz.py -k nccl` runs 2000."""

from __future__ import annotations

import random
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.sim.fr_nccl import judge, random_plan, write_set
from distdoctor.trace.loaders import load_traces

LONG = settings.default.max_examples >= 2000
CHECKS = settings(max_examples=2000 if LONG else 40, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])


@CHECKS
@given(seed=st.integers(0, 2**31 - 1), active_only=st.booleans(), form=st.sampled_from(["pickle", "json"]),
       prefix=st.sampled_from(["_dump_", "rank_", "nccl_trace_rank_"]))
def test_generated_nccl_sets_are_diagnosed_right(seed, active_only, form, prefix):
    plan = random_plan(random.Random(seed))
    plan.active_only = active_only
    with tempfile.TemporaryDirectory() as d:
        truth = write_set(d, plan, seed, form, prefix)
        report = analyze(load_traces([d], world_size=plan.tp * plan.pp * plan.dp))
    why = judge(report.findings, truth)
    assert not why, (why, plan, [f.to_json() for f in report.findings[:3]])
