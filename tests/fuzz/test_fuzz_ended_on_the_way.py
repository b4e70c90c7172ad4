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
`gloo-dcp8-sigterm-first` (its dumps in both forms). Where the first rank left no dump (killed so that it wrote
none), it is named, and no rank the launcher's signal ended is.
"""

from __future__ import annotations

import tempfile

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace

from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import PEER_CLOSED, USER, Job, Step, blocking_call, write

T0 = 1000.0


def _call(i: int, step: Step, world: int, start: float, end: float | None, seq: int | None = None) -> Entry:
    out = 8 * world if step.op == "all_gather" else None
    return blocking_call(i, step.op, end is not None, group=step.group, seq=seq, out_size=out, start=start, end=end)


@st.composite
def ended_on_the_way(draw, apart: bool = False) -> tuple[Job, dict[int, RankTrace], int, set[int], str]:
    """(the job, each rank's full trace, the rank the signal ended first, the ranks on their way, the form).
    `apart`: the next call is on a group of the others alone (the first rank's end is nobody's wait there)."""
    world = draw(st.integers(3, 8))
    k = draw(st.integers(1, 5))  # calls every rank completed
    steps = [Step("0", draw(st.sampled_from(["broadcast", "all_reduce"])), cpp=draw(st.booleans())) for _ in range(k)]
    culprit = draw(st.integers(0, world - 1))
    others = [r for r in range(world) if r != culprit]
    steps.append(Step("1" if apart else "0", "all_gather"))
    groups = {"0": list(range(world)), **({"1": others} if apart else {})}
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
                      groups={g: GroupInfo(g, m, False, "default_pg" if g == "0" else "mesh") for g, m in groups.items()
                              if r in m},
                      stacks={"MainThread (1)": [Frame("<module>", USER, 1), Frame("step", USER, 200)]},
                      dump_reason="signal: SIGTERM", dump_time=done + stopped + 0.001 * r)
        if r == culprit:
            t.dump_time = done + died
        elif r in present:
            t.entries.append(_call(k, steps[-1], len(groups[steps[-1].group]), done + arrive[r], None,
                                   seq=1 if apart else None))
            if r == closed:
                kind, _, message = PEER_CLOSED.partition(": ")
                t.dump_reason, t.dump_time = f"exception: {PEER_CLOSED}", done + max(died, arrive[r]) + 0.001
                t.exception = {"type": kind, "message": message, "thread": "MainThread",
                               "where": f"step ({USER}:{100 + k})", "exit_code": 1}
        out[r] = t
    job = Job(world=world, groups=groups, descs={g: "default_pg" if g == "0" else "mesh" for g in groups},
              steps=steps, faults={})
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


@CHECKS
@given(st.booleans().flatmap(lambda apart: ended_on_the_way(apart=apart)))
def test_a_rank_that_left_no_dump_comes_before_the_first_the_launcher_ended(case):
    """The same, with the first rank killed so that it wrote no dump (SIGKILL, SIGSEGV), and the next call on its
    group or on a group of the others alone: the launcher's SIGTERMs to the rest are consequences of its death,
    none of them a cause. (The run that found it, 70-245 below, also had a rank left waiting in a third group for
    a rank on its way, which sent the explainer to the first signal: `explain.Explainer._lost_anywhere`.)"""
    job, traces, culprit, on_way, form = case
    del traces[culprit]
    with tempfile.TemporaryDirectory() as d:
        write(d, job, traces, {r: form for r in traces})
        ts = load_traces([d], world_size=job.world)
    assert ts.errors == [], ts.errors
    got = [(f.kind, f.ranks) for f in analyze(ts).findings]
    assert got and got[0] == ("missing_dump", [culprit]), got
    assert not any(kind == "crashed" for kind, _ in got), got


def test_the_real_dcp_run_reads_the_same_merged_as_from_the_recorder_alone():
    """`gloo-dcp8-sigterm-first`: each rank's trace with its Flight Recorder pickle, as `run` reads them."""
    for pattern in ("rank_*.jsonl", "rank_*"):
        _, report = diagnose_form("gloo-dcp8-sigterm-first", pattern, 8)
        first = report["findings"][0]
        assert (first["kind"], first["ranks"]) == ("crashed", [4]), (pattern, report["findings"])


def test_the_real_tp_run_whose_first_rank_left_no_dump_names_it_merged():
    """`gloo-tp8-sigsegv-lost`: rank 6 SIGSEGVed (no dump); the launcher's SIGTERM ended the rest, rank 3 waiting
    for rank 2, which it ended on its way. Each rank's trace with its Flight Recorder pickle, as `run` reads them."""
    fired = truth("gloo-tp8-sigsegv-lost")
    assert (fired["kind"], fired["rank"]) == ("kill", 6)
    _, report = diagnose_form("gloo-tp8-sigsegv-lost", "rank_*", 8)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_dump", [6]), report["findings"]
    assert not any(f["kind"] == "crashed" for f in report["findings"]), report["findings"]
