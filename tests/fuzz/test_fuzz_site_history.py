"""Even votes broken by a call site's history (ties.py, `site_history`): a training step calls the same lines each
time, so what the members always passed at a call site is what it takes; when a rank changes its call there (a
size, a dtype) and Gloo aborts the peers that would have outvoted it, the one survivor left beside it is not the
odd one. A broadcast's root completes by sending, agreed with or not: its completion is no vote.

Over generated jobs (a program of steps run for several iterations on one group; trace_sets.py writes the dumps)
where one rank changes one call of a later iteration and every other member but one leaves no trace, in the
recorder's and Flight Recorder's forms; and over a real run's dumps kept as a fixture (fuzz/jobs.py's `objects`
under `distdoctor run --inject resize:0@call=11`, 4 ranks over gloo: rank 0, the root of broadcast_object_list,
passed a sizes tensor of 2 where 1 was always passed; ranks 1 and 2 were aborted, rank 3 alone was left).
"""

from __future__ import annotations

import tempfile

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces

from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import Call, Job, traces, write


@st.composite
def changed_iterations(draw):
    n = draw(st.integers(2, 6))
    program = [(draw(st.sampled_from(["all_reduce", "broadcast", "all_gather"])), draw(st.sampled_from([4, 8, 16])),
                draw(st.sampled_from(["float32", "int64"]))) for _ in range(draw(st.integers(1, 4)))]
    iterations = draw(st.integers(2, 4))
    k = draw(st.integers(0, len(program) - 1))
    r, s = draw(st.permutations(range(n)))[:2]
    return n, program, iterations, k, r, s, draw(st.sampled_from(["size", "dtype"]))


def _execute(n, program, iterations, k, r, s, change):
    """Every rank runs the program `iterations` times (each step from its own line); in the last iteration rank r
    changes step k's call; the members but r and s die there without a trace; s waits in that call; r is in it
    too, or past it when it is the broadcast's root (its send completed)."""
    lost = [m for m in range(n) if m not in (r, s)]
    ran = {}
    for x in (r, s):
        calls = []
        for it in range(iterations):
            for j, (op, size, dtype) in enumerate(program):
                last = it == iterations - 1 and j == k
                if last and x == r and change == "size":
                    size *= 2
                if last and x == r and change == "dtype":
                    dtype = "float32" if dtype != "float32" else "int64"
                root = r if op == "broadcast" else None
                calls.append(Call("0", op, size, dtype, root, line=100 + j,
                                  done=not last or (x == r and op == "broadcast")))
                if last:
                    break
            else:
                continue
            break
        ran[x] = (calls, len(calls), "done")
    return Job(n, {"0": list(range(n))}, {"0": "default_pg"}, [], {m: ("no_dump", 0) for m in lost}), ran


@CHECKS
@given(changed_iterations(), st.sampled_from(["native", "pickle", "json"]))
def test_the_rank_that_changed_a_call_its_site_always_made_otherwise_is_named(case, form):
    n, program, iterations, k, r, s, change = case
    job, ran = _execute(*case)
    with tempfile.TemporaryDirectory() as d:
        write(d, job, traces(job, ran), {x: form for x in ran})
        report = analyze(load_traces([d], world_size=n))
    first = report.findings[0]
    assert first.kind in ("size_mismatch", "dtype_mismatch"), (first.kind, first.ranks, first.detail)
    if form != "json":  # call sites from the frames: the history decides
        assert first.ranks == [r], (first.ranks, first.detail)
    else:  # no frames: a site is its op and dtype, whose history may hold the changed value (another step's)
        assert first.ranks == [r] or (first.ranks == sorted((r, s)) and "one of ranks" in first.detail), \
            (first.ranks, first.detail)


def test_a_real_broadcast_object_list_whose_root_resized_names_the_root():
    fired = truth("gloo-objects-resize-root")
    assert (fired["kind"], fired["rank"]) == ("resize", 0)
    for pattern in ("rank_*.jsonl", "rank_*.fr.pkl", "json/rank_*.fr.json"):
        first = diagnose_form("gloo-objects-resize-root", pattern, 4)[1]["findings"][0]
        assert (first["kind"], first["ranks"]) == ("size_mismatch", [0]), (pattern, first)
