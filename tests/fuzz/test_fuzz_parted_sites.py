"""A rank whose call sites part from its peers', where Gloo aborted a peer, is named (diagnose/parted.py).

A real MoE run (4 ranks, rank 0 skipped its token dispatch all_to_all): its combine all_to_all met the others'
dispatch, Gloo aborted rank 2 (no dump), and every survivor died of the reset connection. The dumps hold no
mismatch, only a missing one: every mode named rank 2 (`missing_dump`), the victim. The call sites still show it:
rank 0's #2 came from the line of the others' #3.

The family: one group, every call the same collective from its own line (so nothing but the site tells them
apart), one rank that skips a call or issues one more, one other member Gloo aborted (no dump), the survivors
dead of the reset connection in the call they were in, some of them a call further on. Written as the
recorder's traces, Flight Recorder's pickles (with the calls' stacks) or both merged. The first finding names
the rank that parted, and how.
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
from trace_sets import USER, Job, Step, blocking_call, write

RESET = ("RuntimeError: [pair.cc:537] Read error [127.0.0.1]:38024: Connection reset by peer. This is typically "
         "caused by a remote worker hanging or being killed.")


def _call(i: int, op: str, line: int, size: int, done: bool) -> Entry:
    return blocking_call(i, op, done, line=line, size=size, error=None if done else RESET)


@st.composite
def parted_jobs(draw) -> tuple[Job, dict[int, RankTrace], int, str, str]:
    """(the job, the survivors' traces, the rank that parted, 'skipped' or 'extra', the form)."""
    world = draw(st.integers(4, 8))  # two survivors besides it at least: of two, either may be the odd one
    n = draw(st.integers(3, 7))
    op = draw(st.sampled_from(["all_to_all", "all_reduce", "all_gather", "broadcast"]))
    steps = [Step("0", op) for _ in range(n)]
    culprit, lost = draw(st.permutations(range(world)))[:2]
    how = draw(st.sampled_from(["skipped", "extra"]))
    at = draw(st.integers(0, n - 3))  # the step it skipped, or issued one more before
    others = [r for r in range(world) if r not in (culprit, lost)]
    ahead = draw(st.sets(st.sampled_from(others), min_size=1 if how == "skipped" else 0))
    lines = [100 + k for k in range(n)]
    mine = lines[:at] + (lines[at + 1:at + 2] if how == "skipped" else [900, lines[at]])
    out = {}
    for r in range(world):
        if r == lost:
            continue  # Gloo aborted it: SIGABRT, no dump
        if r == culprit:
            got = [_call(i, op, line, 8, i < len(mine) - 1) for i, line in enumerate(mine)]
        else:
            reach = at + 2 if r in ahead else at + 1  # how many calls it issued: a call further on, or not
            got = [_call(i, op, lines[i], 8 if op != "all_to_all" else 8 + r, i < reach - 1) for i in range(reach)]
        kind, _, message = RESET.partition(": ")
        now = got[-1].frames[0].line  # where it died: in its last call
        out[r] = RankTrace(rank=r, source="native", world_size=world, entries=got,
                           groups={"0": GroupInfo("0", list(range(world)), False, "default_pg")},
                           stacks={"MainThread (1)": [Frame("<module>", USER, 1), Frame("step", USER, now)]},
                           dump_reason=f"exception: {RESET}", dump_time=1100.0 + 0.01 * r,
                           exception={"type": kind, "message": message, "thread": "MainThread",
                                      "where": f"step ({USER}:{now})", "exit_code": 1})
    job = Job(world=world, groups={"0": list(range(world))}, descs={"0": "default_pg"}, steps=steps, faults={})
    return job, out, culprit, how, draw(st.sampled_from(["native", "pickle", "both"]))


@CHECKS
@given(parted_jobs())
def test_the_rank_whose_call_sites_part_is_named_before_the_lost_one(case):
    job, traces, culprit, how, form = case
    with tempfile.TemporaryDirectory() as d:
        write(d, job, traces, {r: form for r in traces})
        ts = load_traces([d], world_size=job.world)
    assert ts.errors == [], ts.errors
    report = analyze(ts)
    first = report.findings[0]
    assert (first.kind, first.ranks, first.evidence.get("parted")) == ("type_mismatch", [culprit], how), \
        [(f.kind, f.ranks, f.detail) for f in report.findings]


def test_the_real_moe_run_names_the_rank_that_skipped():
    """`gloo-moe-skip-aborted`: rank 0 skipped call 2 (the token dispatch), rank 2 aborted without a dump."""
    fired = truth("gloo-moe-skip-aborted")
    assert (fired["kind"], fired["rank"]) == ("skip", 0)
    for pattern in ("rank_*.jsonl", "rank_*"):
        _, report = diagnose_form("gloo-moe-skip-aborted", pattern, 4)
        first = report["findings"][0]
        assert (first["kind"], first["ranks"]) == ("type_mismatch", [0]), (pattern, report["findings"])
        assert "skipped" in first["detail"]
