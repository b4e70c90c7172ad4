"""all_to_all: each member's sizes are its own (its splits), yet every element one member sends another receives:
the members' inputs add up to their outputs (match.py, `_unconserved`). One member that resized its call breaks
the sum; the member whose input alone differs from the others' by exactly the surplus is named, else every
member ("one of ranks ..."), never `ok`.

Over generated jobs (trace_sets.py, whose programs include all_to_all) with one rank's all_to_all resized, in the
recorder's and Flight Recorder's forms, and over a real run's dumps kept as a fixture (fuzz/jobs.py's `moe` under
`distdoctor run --inject resize:2@call=14`, 4 ranks over gloo: rank 2's token all_to_all_single got one row more).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS, _diagnose
from trace_sets import Job, Step


@st.composite
def resized_all_to_all(draw) -> Job:
    world = draw(st.integers(2, 8))
    steps = [Step("0", draw(st.sampled_from(["all_to_all", "all_reduce"])), draw(st.sampled_from([4, 8, 16])))
             for _ in range(draw(st.integers(0, 3)))]
    at = len(steps)
    steps.append(Step("0", "all_to_all", draw(st.sampled_from([4, 8, 16]))))
    steps += [Step("0", "all_reduce", 1) for _ in range(draw(st.integers(0, 2)))]
    rank = draw(st.integers(0, world - 1))
    return Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, {rank: ("size", at)})


@CHECKS
@given(resized_all_to_all(), st.sampled_from(["native", "pickle", "json"]))
def test_a_resized_all_to_all_names_the_rank_that_resized_it(job, form):
    (rank, _), = job.faults.items()
    _, _, report = _diagnose(job, {r: form for r in range(job.world)})
    assert report.verdict == "problem"
    first = report.findings[0]
    assert (first.kind, first.ranks, first.op) == ("size_mismatch", [rank], "all_to_all"), first.detail


def test_a_real_moe_resize_is_named_from_every_form():
    fired = truth("gloo-moe-resize")
    assert (fired["kind"], fired["rank"]) == ("resize", 2)
    for pattern in ("rank_*.jsonl", "rank_*.fr.pkl", "json/rank_*.fr.json"):
        first = diagnose_form("gloo-moe-resize", pattern, 4)[1]["findings"][0]
        assert (first["kind"], first["ranks"]) == ("size_mismatch", [2]), (pattern, first)
