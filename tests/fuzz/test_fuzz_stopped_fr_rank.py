"""A rank that stopped in Python after its step's calls from C++ (DDP's gradient buckets), read from its Flight
Recorder, beside ranks that left only the recorder's trace: the shape `run` reads live when a rank's Python does
not answer (its GIL held: `hang:R:gil`), and takes that rank's Flight Recorder from C++. The others wait in their
next call from Python, which the stopped rank never issued: it has no number the traces can fix (calls the
recorder cannot see came after the last one placed). The loose placement meant for a call of another size or
dtype placed it at the stopped rank's bucket, `size_mismatch` naming the stopped rank; else, with no number,
nothing waited for anyone: `stuck_collective` of the waiting ranks, "every other member issued it too" (real 8-rank
DDP and DCP runs, live). Over generated jobs: the stopped rank is named alone, as the one the others wait for."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from test_fuzz_invariant import CHECKS
from trace_sets import Job, Step, analyzed, run, traces, with_frontier


@st.composite
def stopped_after_cpp(draw):
    world = draw(st.integers(2, 8))
    steps, stops = [Step("0", "broadcast", 8, root=0)], []
    buckets = draw(st.lists(st.sampled_from([8, 16]), min_size=1, max_size=3))  # the same every step
    for _ in range(draw(st.integers(2, 4))):
        steps += [Step("0", "all_reduce", size, cpp=True) for size in buckets]  # the backward's buckets: C++
        stops.append(len(steps))
        steps.append(Step("0", "all_reduce", 1))  # the loss for the log line: Python
    at = draw(st.sampled_from(stops[1:]))
    stopped = draw(st.integers(0, world - 1))
    job = Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, {stopped: ("stop", at)})
    forms = {r: draw(st.sampled_from(["pickle", "json"])) if r == stopped else "native" for r in range(world)}
    return job, stopped, forms, draw(st.booleans())


@CHECKS
@given(stopped_after_cpp())
def test_the_rank_its_flight_recorder_shows_in_no_call_is_the_one_the_others_wait_for(case):
    job, stopped, forms, frontier = case
    out = {r: with_frontier(t, job.groups) if frontier and forms[r] == "native" else t
           for r, t in traces(job, run(job)).items()}
    report = analyzed(job, out, forms, p2p=False, listed=False)
    got = [(f.kind, f.ranks, f.detail[:200]) for f in report.findings]
    assert report.findings and (report.findings[0].kind, report.findings[0].ranks) == ("missing_ranks", [stopped]), got
