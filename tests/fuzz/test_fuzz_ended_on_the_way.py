"""Ranks ended on their way are consequences in every view that has their end time (diagnose/ended.py).

A launcher ends every rank once one of them dies. A rank between two calls at that moment never issued the call
its peers were already in; it reads as absent, yet it was on its way - ended about as soon as its peers went from
the last call they shared to this one. A real DCP run (8 ranks, rank 4 SIGTERMed at a step) read right from the
recorder's traces alone and wrong from what `run` reads, each rank's trace merged with its Flight Recorder dump:
`missing_ranks [0, 1, 4, 6, 7]`. DDP issues its buckets from C++, so the last call the ranks shared was one only
Flight Recorder saw, and Gloo's records no completion time: the rule measured nothing. A blocking collective
completes for no member before its last member arrives: that arrival is the shared completion when a dump has none.

The family: one group, calls broadcast or all_reduced, each issued from Python or from C++ (in the Flight Recorder
dump only), with arrival jitter; one rank is SIGTERMed after the last shared call, some ranks reach the next one
(an all_gather), the launcher then ends the rest on their way (within the pace the rule allows), and one rank in
the all_gather may die of the closed connection first. Written as the recorder's traces alone or each merged with
its Flight Recorder pickle. Whatever the layout, the first finding is the rank the signal ended first, and the
ranks on their way are consequences of it (not it, and not said to be blocked elsewhere). The run itself is
`gloo-dcp8-sigterm-first` (its dumps in both forms).
"""

from __future__ import annotations

import tempfile

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace

from real_dumps import diagnose_form
from test_fuzz_invariant import CHECKS
from trace_sets import PEER_CLOSED, USER, Job, Step, blocking_call, write

T0 = 1000.0


def _call(i: int, step: Step, world: int, start: float, end: float | None) -> Entry:
    out = 8 * world if step.op == "all_gather" else None
    return blocking_call(i, step.op, end is not None, out_size=out, start=start, end=end)


@st.composite
def ended_on_the_way(draw) -> tuple[Job, dict[int, RankTrace], int, set[int], str]:
    """(the job, each rank's full trace, the rank the signal ended first, the ranks on their way, the form)."""
    world = draw(st.integers(3, 8))
    k = draw(st.integers(1, 5))  # calls every rank completed
    steps = [Step("0", draw(st.sampled_from(["broadcast", "all_reduce"])), cpp=draw(st.booleans())) for _ in range(k)]
    steps.append(Step("0", "all_gather"))
    culprit = draw(st.integers(0, world - 1))
    others = [r for r in range(world) if r != culprit]
    present = draw(st.sets(st.sampled_from(others), min_size=1, max_size=len(others) - 1))
    # from the last shared call's completion: the culprit's end, then the launcher's SIGTERM to the rest at its
    # next poll (apart by more than crash.SAME_MOMENT_S); the ranks in the all_gather were there by then, the
    # latest of them within the pace the rule allows of the ranks it ended on their way
    died = draw(st.floats(0.005, 0.04))
    stopped = died + draw(st.floats(0.06, 0.3))
    first, *rest = sorted(present)
    arrive = {first: draw(st.floats(stopped / 1.5, stopped - 0.002))}
    arrive.update({r: draw(st.floats(0.01, stopped - 0.002)) for r in rest})
    closed = draw(st.sampled_from([None, *sorted(present)]))
    entries: dict[int, list[Entry]] = {r: [] for r in range(world)}
    done = T0
    for i, step in enumerate(steps[:-1]):
        starts = {r: done + 0.5 + draw(st.floats(0.0, 0.05)) for r in range(world)}
        done = max(starts.values()) + 0.001
        for r in range(world):
            entries[r].append(_call(i, step, world, starts[r], done))
    out = {}
    for r in range(world):
        t = RankTrace(rank=r, source="native", world_size=world, entries=entries[r],
                      groups={"0": GroupInfo("0", list(range(world)), False, "default_pg")},
                      stacks={"MainThread (1)": [Frame("<module>", USER, 1), Frame("step", USER, 200)]},
                      dump_reason="signal: SIGTERM", dump_time=done + stopped + 0.001 * r)
        if r == culprit:
            t.dump_time = done + died
        elif r in present:
            t.entries.append(_call(k, steps[-1], world, done + arrive[r], None))
            if r == closed:
                kind, _, message = PEER_CLOSED.partition(": ")
                t.dump_reason, t.dump_time = f"exception: {PEER_CLOSED}", done + max(died, arrive[r]) + 0.001
                t.exception = {"type": kind, "message": message, "thread": "MainThread",
                               "where": f"step ({USER}:{100 + k})", "exit_code": 1}
        out[r] = t
    job = Job(world=world, groups={"0": list(range(world))}, descs={"0": "default_pg"}, steps=steps, faults={})
    # a recorder's trace that holds no call the ranks shared (every one issued from C++) cannot time them
    forms = ["both"] + (["native"] if not all(step.cpp for step in steps[:-1]) else [])
    return job, out, culprit, set(others) - present, draw(st.sampled_from(forms))


@CHECKS
@given(ended_on_the_way())
def test_the_rank_a_signal_ended_first_comes_first_and_those_on_their_way_follow(case):
    job, traces, culprit, on_way, form = case
    with tempfile.TemporaryDirectory() as d:
        write(d, job, traces, {r: form for r in traces})
        ts = load_traces([d])
    assert ts.errors == [], ts.errors
    report = analyze(ts)
    got = [(f.kind, f.ranks) for f in report.findings]
    assert got and got[0] == ("crashed", [culprit]), got
    assert not any(set(ranks) & on_way for kind, ranks in got if kind == "missing_ranks"), got
    for c in report.consequences:  # the rank the finding names is no victim of it; ranks on their way wait nowhere
        if "on their way" in c["because"]:
            assert culprit not in c["ranks"], c
        assert not ("blocked in other collectives" in c["because"] and set(c["ranks"]) & (on_way | {culprit})), c


def test_the_real_dcp_run_reads_the_same_merged_as_from_the_recorder_alone():
    """`gloo-dcp8-sigterm-first`: each rank's trace with its Flight Recorder pickle, as `run` reads them."""
    for pattern in ("rank_*.jsonl", "rank_*"):
        _, report = diagnose_form("gloo-dcp8-sigterm-first", pattern, 8)
        first = report["findings"][0]
        assert (first["kind"], first["ranks"]) == ("crashed", [4]), (pattern, report["findings"])
