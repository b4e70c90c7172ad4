"""Gloo aborts a process (SIGABRT, no dump) whose peer passes another dtype or size: the rank that changed its
call is the cause, its aborted peers the victims (siblings.py, `unmet_by_siblings`: the call is compared with what
the sibling groups' members all passed at that position).

Over generated 2-D mesh jobs (dp x tp groups running one program; trace_sets.py writes the dumps) where one rank
changes the dtype or size of one call and the other members of that call's group leave no trace, in the
recorder's and Gloo Flight Recorder's forms; the same jobs with no change and a peer killed (nothing to blame
but the lost rank), and with sibling groups that legitimately differ (pipeline stages) and a peer killed; where
the changed call is the group's first ("one of" both sides: nothing vouches for the groups running alike); and over
a real run's dumps kept as a fixture (fuzz/jobs.py's `tp` under `distdoctor run --inject retype:1@call=12`, 4
ranks over gloo: rank 1's data-parallel all_reduce went float64, rank 3 was aborted and left no dump).
"""

from __future__ import annotations

import tempfile

from hypothesis import assume, given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.findings.kinds import fmt_ranks
from distdoctor.trace.loaders import load_traces

from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import Call, Job, traces, write
OPS = ("all_reduce", "all_gather", "broadcast")


def _mesh(dp: int, tp: int) -> tuple[dict, dict, dict]:
    """Groups (dp groups '1'.., tp groups after), their descriptions, and each rank's group per dimension."""
    groups, descs, of = {"0": list(range(dp * tp))}, {"0": "default_pg"}, {}
    for j in range(tp):
        name = str(1 + j)
        groups[name], descs[name] = [i * tp + j for i in range(dp)], "mesh_dp"
    for i in range(dp):
        name = str(1 + tp + i)
        groups[name], descs[name] = [i * tp + j for j in range(tp)], "mesh_tp"
    for name, members in groups.items():
        for r in members:
            of.setdefault(r, {})[descs[name]] = name
    return groups, descs, of


@st.composite
def mesh_jobs(draw, change=("dtype", "size", "none"), stages: bool = False):
    dp, tp = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (2, 4)]))
    groups, descs, of = _mesh(dp, tp)
    program = [(draw(st.sampled_from(["mesh_dp", "mesh_tp"])), draw(st.sampled_from(OPS)),
                draw(st.sampled_from([4, 8, 16])), draw(st.sampled_from(["float32", "bfloat16"])))
               for _ in range(draw(st.integers(2, 8)))]
    r = draw(st.integers(0, dp * tp - 1))
    k = draw(st.integers(1, len(program) - 1))
    return dp, tp, groups, descs, of, program, r, k, draw(st.sampled_from(change)), stages


def _execute(dp, tp, groups, descs, of, program, r, k, change, stages):
    """Each rank's calls: everyone runs the program; at step k rank r passes the changed call (or, with no change,
    nothing differs) and the other members of its group there die without a trace; every rank then blocks at the
    first call whose group holds a rank that stopped."""
    dim = program[k][0]
    lost = [m for m in groups[of[r][dim]] if m != r]
    stopped_at = {m: k for m in lost + [r]}
    world = dp * tp
    ran = {}

    def size_of(x, d, s):  # pipeline stages: each dp group (one per tp index) moves its own tensor sizes
        return s * (1 + x % tp) if stages and d == "mesh_dp" else s

    for x in sorted(range(world), key=lambda x: x not in stopped_at):
        calls = []
        for j, (d, op, s, dt) in enumerate(program):
            g = of[x][d]
            blocked = [m for m in groups[g] if m != x and stopped_at.get(m, len(program)) <= j]
            mine = x == r and j == k
            size, dtype = size_of(x, d, s), dt
            if mine and change == "size":
                size *= 2
            if mine and change == "dtype":
                dtype = "float32" if dt != "float32" else "bfloat16"
            calls.append(Call(g, op, size, dtype, root=groups[g][0] if op == "broadcast" else None, line=100 + j,
                              done=not (blocked or mine)))
            if blocked or mine:
                stopped_at.setdefault(x, j)
                break
        ran[x] = (calls, len(calls), "done")
    job = Job(world, groups, descs, [], {m: ("no_dump", 0) for m in lost},
              crash_text="RuntimeError: Connection reset by peer")
    return job, ran, lost


def _first(job, ran, form):
    ts_in = traces(job, ran)
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, {x: form for x in ts_in}, p2p=False)
        ts = load_traces([d], world_size=job.world)
    assert ts.errors == [], ts.errors
    report = analyze(ts)
    return report.findings[0] if report.findings else None


@CHECKS
@given(mesh_jobs(), st.sampled_from(["native", "pickle", "json"]))
def test_the_rank_that_changed_its_call_is_named_not_the_peer_gloo_aborted(case, form):
    dp, tp, groups, descs, of, program, r, k, change, stages = case
    dim = program[k][0]
    earlier = [j for j in range(k) if program[j][0] == dim]
    assume(earlier)  # the group's history is what lets the siblings vouch for the call
    job, ran, lost = _execute(*case)
    first = _first(job, ran, form)
    assert first is not None
    if change == "none":  # nothing changed: the peers that left no trace are what the dumps show
        assert first.kind == "missing_dump" and first.ranks == lost, (first.kind, first.ranks, first.detail)
    else:
        assert (first.kind, first.ranks) == (f"{change}_mismatch", [r]), (first.kind, first.ranks, first.detail)
        assert "left no trace" in first.detail


@CHECKS
@given(mesh_jobs(change=("none",), stages=True), st.sampled_from(["native", "pickle"]))
def test_sibling_groups_that_differ_vouch_for_nothing(case, form):
    """Pipeline stages: the dp groups of each stage pass their own sizes; a peer killed there is the lost rank,
    and the survivor whose sizes differ from the other stages' is no culprit. In the group's first call nothing
    yet says the stages differ by design: then "one of" both, never the survivor alone."""
    dp, tp, groups, descs, of, program, r, k, change, stages = case
    job, ran, lost = _execute(*case)
    first = _first(job, ran, form)
    assert first is not None
    if first.kind != "missing_dump":  # the lost rank among the suspects, beside a member's first call there
        assert first.evidence.get("undecided") and set(lost) <= set(first.ranks), (first.ranks, first.detail)
        assert first.detail.startswith(f"one of {fmt_ranks(first.ranks)}:") and "first call" in first.detail
    else:
        assert first.ranks == lost, (first.kind, first.ranks)


@CHECKS
@given(mesh_jobs(change=("size", "dtype")), st.sampled_from(["native", "pickle", "json"]))
def test_a_first_call_unlike_the_siblings_beside_a_lost_peer_is_one_of_both(case, form):
    """The changed call is the rank's first on its group: no earlier call vouches for the groups running alike
    (a tensor-parallel job's data-parallel groups may pass uneven shards), so a size unlike the siblings' and a
    peer with no trace are "one of" the two sides - the rank may have changed its call and cost its peer its
    process, or the peer died of its own. A dtype beside the same collective needs no history: it is claimed."""
    dp, tp, groups, descs, of, program, r, k, change, stages = case
    assume(not any(program[j][0] == program[k][0] for j in range(k)))
    job, ran, lost = _execute(*case)
    first = _first(job, ran, form)
    assert first is not None
    if change == "dtype":
        assert (first.kind, first.ranks) == ("dtype_mismatch", [r]), (first.kind, first.ranks, first.detail)
    else:
        assert first.kind == "size_mismatch", (first.kind, first.ranks, first.detail)
        _assert_one_of_both(first, lost, r)


def _assert_one_of_both(first, lost, r):
    assert first.evidence.get("undecided") and first.ranks == sorted(lost + [r]), (first.ranks, first.detail)
    assert first.detail.startswith(f"one of {fmt_ranks(first.ranks)}:"), first.detail
    assert "left no trace" in first.detail and "first call on the group" in first.detail


def test_a_real_tensor_parallel_retype_names_the_rank_that_changed_its_dtype():
    fired = truth("gloo-tp-retype-abort")
    assert (fired["kind"], fired["rank"]) == ("retype", 1)
    for pattern in ("rank_*.jsonl", "rank_*.fr.pkl", "json/rank_*.fr.json"):
        first = diagnose_form("gloo-tp-retype-abort", pattern, 4)[1]["findings"][0]
        assert (first["kind"], first["ranks"]) == ("dtype_mismatch", [1]), (pattern, first)
        assert "rank 3" in first["detail"] and "left no trace" in first["detail"]
