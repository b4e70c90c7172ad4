"""A skipper whose next call came from C++ is named by its communicator's frontier (diagnose/parted.py,
`_parted_by_frontier`).

A real DDP run (4 ranks, rank 1 skipped its loss all_reduce): rank 1's next call was a gradient bucket DDP
issued from C++; it met rank 0's loss all_reduce, Gloo aborted rank 0 (no dump), ranks 2 and 3 died in the
loss all_reduce of the closed connection. Read from the recorder's traces alone, or with Flight Recorder dumps of
ranks 2 and 3, the verdict was `missing_dump [0]`: rank 1's trace shows no next call to compare (its recorder
cannot see C++'s), so the call-site rule had nothing to read. Its frontier did: its communicator had enqueued the
number where the others are in their loss all_reduce, and more, with no such call in its recorder's trace.

The family: one group; Python and C++ calls in any order; one rank skips a Python call followed by a C++ one
(and issues one or more C++ calls after it, Gloo's asynchronous buckets); one other member left no dump; the
rest are in the skipped call, or died in it of the closed connection. Every rank the recorder's trace with its
frontier, or the skipper so and at least two others Flight Recorder pickles; there the skipped call is of a kind
the skipper's recorder saw before and never missed (a loss logged every step), else its trace cannot tell that
call from one issued from C++, and all the survivors in one call read as waiting for the lost rank, which is
what the dumps then say. The first finding names the skipper alone: `type_mismatch` (or `missing_ranks`, where
the survivors' own traces show it absent from the call).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.trace.model import Frame, GroupInfo, RankTrace

from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import PEER_CLOSED, TORCH_FRAME, USER, Job, Step, analyzed, blocking_call, with_frontier


@st.composite
def _skipped_program(draw) -> tuple[list[Step], int]:
    """(one group's calls, Python's and C++'s in any order; the Python call the skipper skips: a C++ one follows
    it)."""
    kinds = draw(st.lists(st.booleans(), min_size=4, max_size=10))  # True: issued from C++
    kinds[0] = False
    gaps = [i for i in range(1, len(kinds) - 1) if not kinds[i] and kinds[i + 1]]
    if not gaps:
        kinds[1:3] = [False, True]
        gaps = [1]
    steps = [Step("0", "all_reduce", 8 if cpp else draw(st.sampled_from([1, 16])), cpp=cpp) for cpp in kinds]
    return steps, draw(st.sampled_from(gaps))


@st.composite
def skipped_before_cpp(draw):
    world = draw(st.integers(4, 8))
    steps, k = draw(_skipped_program())
    mixed = draw(st.booleans())
    if mixed:  # placed among Flight Recorder's calls, the skipped call is of a kind its recorder saw before
        steps[k] = replace(steps[k], size=steps[0].size)  # (one it never missed: else no proof it differs)
    skipper, lost = draw(st.permutations(range(world)))[:2]
    cpp_after = [i for i in range(k + 1, len(steps)) if steps[i].cpp]
    issued = cpp_after[:draw(st.integers(1, len(cpp_after)))]  # its asynchronous buckets, all enqueued
    groups = {"0": list(range(world))}
    out, forms = {}, {}
    for r in range(world):
        if r == lost:
            continue
        if r == skipper:
            mine = list(range(k)) + issued
            calls = [blocking_call(i, steps[i].op, i < k, seq=n + 1, size=steps[i].size, line=100 + i)
                     for n, i in enumerate(mine)]
            stack = [Frame("<module>", USER, 1), Frame("step", USER, 100 + issued[0]), TORCH_FRAME]
            ended = {"dump_reason": "signal: SIGTERM", "dump_time": 1000.3 + k}  # the launcher's, once others died
        else:
            calls = [blocking_call(i, steps[i].op, i < k, size=steps[i].size, line=100 + i) for i in range(k + 1)]
            stack = [Frame("<module>", USER, 1), Frame("step", USER, 100 + k)]
            died = draw(st.booleans())
            ended = {"dump_reason": f"exception: {PEER_CLOSED}" if died else "signal: SIGTERM",
                     "dump_time": 1000.1 + k + 0.01 * r if died else 1000.3 + k}
        t = RankTrace(rank=r, source="native", world_size=world, entries=calls, stacks={"MainThread (1)": stack},
                      groups={"0": GroupInfo("0", list(range(world)), False, "default_pg")}, **ended)
        out[r] = with_frontier(t, groups, {"0": max(e.seq for e in calls)} if draw(st.booleans()) else None)
        forms[r] = "native"
    others = [r for r in out if r != skipper]
    if mixed:
        fr = draw(st.sets(st.sampled_from(others), min_size=2))
        forms.update({r: "pickle" for r in fr})
    job = Job(world=world, groups=groups, descs={"0": "default_pg"}, steps=steps, faults={})
    return job, out, forms, skipper


@CHECKS
@given(skipped_before_cpp())
def test_a_skipper_whose_next_call_came_from_cpp_is_named_by_its_frontier(case):
    _named_alone(*case)


@st.composite
def skipped_and_passed(draw):
    """The same skip, where the others completed the skipped call (Gloo met it with the skipper's C++ call and
    aborted only the lost rank) and went on past it, into calls from C++ their recorders cannot see: nobody is
    blocked in it. Every survivor completed the same collectives (a collective completes for all its members),
    and then some more in flight. A real DDP run of 8 ranks showed it (fuzz run 74-84: rank 1 skipped its loss
    all_reduce; the recorder's traces read `missing_dump [0]`)."""
    world = draw(st.integers(4, 8))
    steps, k = draw(_skipped_program())
    skipper, lost = draw(st.permutations(range(world)))[:2]
    after = [i for i in range(k + 1, len(steps)) if steps[i].cpp]
    done = draw(st.integers(0, len(after) - 1))  # calls after the skipped one that every survivor completed
    groups = {"0": list(range(world))}
    out = {}
    for r in range(world):
        if r == lost:
            continue
        mine = (list(range(k)) if r == skipper else list(range(k + 1))) + after
        mine = mine[:k + 1 + done + draw(st.integers(0, 1))]  # the next one enqueued, or not yet
        calls = [blocking_call(i, steps[i].op, n < k + 1 + done, seq=n + 1, size=steps[i].size, line=100 + i)
                 for n, i in enumerate(mine)]
        stack = [Frame("<module>", USER, 1), Frame("step", USER, 100 + mine[-1]), TORCH_FRAME]
        died = draw(st.booleans())
        t = RankTrace(rank=r, source="native", world_size=world, entries=calls, stacks={"MainThread (1)": stack},
                      groups={"0": GroupInfo("0", list(range(world)), False, "default_pg")},
                      dump_reason=f"exception: {PEER_CLOSED}" if died else "signal: SIGTERM",
                      dump_time=1000.1 + k + 0.01 * r if died else 1000.3 + k)
        out[r] = with_frontier(t, groups)
    job = Job(world=world, groups=groups, descs={"0": "default_pg"}, steps=steps, faults={})
    return job, out, {r: "native" for r in out}, skipper


@CHECKS
@given(skipped_and_passed())
def test_a_skipper_the_others_went_past_is_named_by_what_its_communicator_completed(case):
    _named_alone(*case)


def _named_alone(job, traces, forms, skipper) -> None:
    """The first finding names the skipper alone: `type_mismatch`, or `missing_ranks` where the survivors' own
    traces show it absent from the call."""
    report = analyzed(job, traces, forms, p2p=False, listed=False)
    first = report.findings[0]
    assert first.ranks == [skipper] and first.kind in ("type_mismatch", "missing_ranks"), \
        [(f.kind, f.ranks, f.detail) for f in report.findings]


def test_the_real_ddp_skip_is_named_from_the_recorders_traces_and_from_mixed_forms():
    """`gloo-ddp-skip-frontier`: rank 1 skipped its loss all_reduce; rank 0 left no dump. From the recorder's
    traces of ranks 1-3, and from rank 1's trace with ranks 2 and 3 as Flight Recorder dumps (pickle, JSON)."""
    fired = truth("gloo-ddp-skip-frontier")
    assert (fired["kind"], fired["rank"]) == ("skip", 1)
    _, recorder = diagnose_form("gloo-ddp-skip-frontier", "rank_*.jsonl", 4)
    _, mixed = diagnose_form("gloo-ddp-skip-frontier", ("rank_1.jsonl", "rank_*.fr.*"), 4)
    for report in (recorder, mixed):
        first = report["findings"][0]
        assert (first["kind"], first["ranks"]) == ("type_mismatch", [1]), report["findings"]
