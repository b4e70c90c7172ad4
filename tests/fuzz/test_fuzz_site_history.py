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


@st.composite
def skipped_in_a_visit(draw):
    """A program whose step visits one call site for two calls, as an object collective does (a sizes call, int64
    [1], then the data, uint8 [N]), between steps of their own lines; in the last iteration one rank skips one of
    the two."""
    n = draw(st.integers(2, 6))
    own = st.tuples(st.sampled_from(["all_reduce", "broadcast", "all_gather"]), st.sampled_from([4, 8, 16]),
                    st.sampled_from(["float32", "int64"]))
    before = draw(st.lists(own, max_size=2))
    which = draw(st.sampled_from([0, 1]))
    after = draw(st.lists(own, min_size=which, max_size=2))  # a call after the visit's last, to be issued early
    op, data = draw(st.sampled_from(["broadcast", "all_gather"])), draw(st.sampled_from([24, 39]))
    step = [(*c, 100 + j) for j, c in enumerate(before)] + [(op, 1, "int64", 200), (op, data, "uint8", 200)] + \
        [(*c, 300 + j) for j, c in enumerate(after)]
    r, s = draw(st.permutations(range(n)))[:2]
    return n, step, draw(st.integers(2, 4)), len(before) + which, r, s, which, bool(before or after)


def _execute_skip(n, step, iterations, k, r, s, *_):
    """Both survivors run the step `iterations` times; in the last, rank r skips call k: its next call meets s's
    call k, where the two stop (r past it when it is the root of a broadcast, whose send completes)."""
    lost = [m for m in range(n) if m not in (r, s)]
    program = step * iterations
    skip = len(step) * (iterations - 1) + k
    ran = {}
    for x in (r, s):
        mine = program[:skip] + (program[skip + 1:skip + 2] if x == r else program[skip:skip + 1])
        calls = [Call("0", op, size, dtype, r if op == "broadcast" else None, line=line,
                      done=i < skip or (x == r and op == "broadcast"))
                 for i, (op, size, dtype, line) in enumerate(mine)]
        ran[x] = (calls, len(calls), "done")
    return Job(n, {"0": list(range(n))}, {"0": "default_pg"}, [], {m: ("no_dump", 0) for m in lost}), ran


@CHECKS
@given(skipped_in_a_visit(), st.sampled_from(["native", "pickle", "json"]))
def test_the_rank_that_skipped_one_of_a_sites_calls_is_named(case, form):
    """The site's history read as a whole holds both of its calls' values; read by each call's place in its
    visit, it tells the rank that skipped the first (its second call in the first's place) from the one that did
    not. Where it cannot tell (the second skipped: the rank's next call is one its place has always seen; visits
    back to back, or no frames: places that run together), the finding names both and says so, never the rank
    that skipped nothing alone."""
    n, step, iterations, k, r, s, which, delimited = case
    job, ran = _execute_skip(*case)
    with tempfile.TemporaryDirectory() as d:
        write(d, job, traces(job, ran), {x: form for x in ran})
        report = analyze(load_traces([d], world_size=n))
    first = report.findings[0]
    assert first.kind in ("size_mismatch", "dtype_mismatch", "type_mismatch"), (first.kind, first.detail)
    if form != "json" and which == 0 and delimited:
        assert first.ranks == [r], (first.ranks, first.detail)
    else:
        assert first.ranks == [r] or (first.ranks == sorted((r, s)) and "one of ranks" in first.detail), \
            (first.ranks, first.detail)


def test_a_real_broadcast_object_list_whose_root_skipped_the_sizes_names_the_root():
    """fuzz/jobs.py's `objects` under `distdoctor run --inject skip:0@call=15`, 4 ranks over gloo: rank 0, the
    root of broadcast_object_list, skipped the sizes broadcast and sent the data in its place; ranks 1 and 2
    were aborted ("39 vs 8"), rank 3 alone was left beside it (`gloo-objects-skip-sizes`). The recorder's
    traces hold each call's stack, its Flight Recorder dumps none."""
    fired = truth("gloo-objects-skip-sizes")
    assert (fired["kind"], fired["rank"]) == ("skip", 0)
    first = diagnose_form("gloo-objects-skip-sizes", "rank_*.jsonl", 4)[1]["findings"][0]
    assert (first["kind"], first["ranks"]) == ("size_mismatch", [0]), first
    # these Flight Recorder dumps hold no stacks: a site is its op, whose places run together; one of the two
    first = diagnose_form("gloo-objects-skip-sizes", "rank_*.fr.pkl", 4)[1]["findings"][0]
    assert (first["kind"], first["ranks"]) == ("size_mismatch", [0, 3]) and "one of ranks 0, 3" in first["detail"]
