"""Ranks that wait for each other at one number of one group are in different calls, not in a swapped order
(diagnose/one_number.py).

A real tensor-parallel run (4 ranks, a 2x2 mesh, rank 3 skipped a broadcast `parallelize_module` makes): its
recorder traces show rank 2 in broadcast #4 of their tensor-parallel group, and rank 3's watchdog shows it in
that group's all_reduce #4 (the forward's, a functional collective its trace cannot hold). The two waits made a
cycle, read `order_deadlock [2, 3]` live and after. The sibling group did a broadcast at #4: rank 3 parted.

The family: a mesh of 2-member tensor-parallel groups (the siblings, one description) of which one member of one
group skipped a Python call; it is then blocked, as its watchdog saw, in the group's next call issued from C++,
while its peer waits in the call it skipped. The skipper leaves the recorder's trace (and its hang header), each
other rank that or a Flight Recorder dump (pickle or JSON: one dump a rank, as a job of mixed forms). The first
finding is a `type_mismatch` naming the rank that skipped, by the siblings; with no sibling group, both, "one of".
The same run read from one dump a rank is `gloo-tp-skip-one-number-mixed`.
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
from trace_sets import USER, Job, blocking_call, write


def _call(i: int, group: str, op: str, seq: int, done: bool) -> Entry:
    return blocking_call(i, op, done, group=group, seq=seq, line=110 + seq, func="tp", size=16)


@st.composite
def skipped_in_a_pair(draw) -> tuple[Job, dict[int, RankTrace], dict[int, str], list[int]]:
    """(the job, every rank's trace, the form it left, the ranks the verdict must name)."""
    pairs = draw(st.integers(1, 4))
    world = 2 * pairs
    n = draw(st.integers(1, 5))  # the Python calls every member made on its group before the hang
    python_op = draw(st.sampled_from(["broadcast", "scatter", "all_gather"]))
    cpp_op = draw(st.sampled_from(["all_reduce", "reduce_scatter"]))
    bad = draw(st.integers(0, pairs - 1))
    skipper = 2 * bad + draw(st.integers(0, 1))
    groups = {str(p + 1): [2 * p, 2 * p + 1] for p in range(pairs)}
    out = {}
    for r in range(world):
        g = str(r // 2 + 1)
        calls = [_call(i, g, python_op, i + 1, True) for i in range(n)]
        hang = None
        if r == skipper:  # skipped call n + 1: its next, issued from C++, is #n + 1 by its communicator's count
            call = {"group": g, "seq": n + 1, "op": cpp_op, "source": "flight_recorder", "since": 1050.0}
            hang = {"status": "confirmed", "detected_at": 1080.0, "since": 1050.0, "blocked_in": call,
                    "this_rank": {"blocked_in": call, "blocked_for_s": 30.0}}
        elif r // 2 == bad:
            calls.append(_call(n, g, python_op, n + 1, False))  # waits for the skipper in the call it skipped
        else:
            calls.append(_call(n, g, python_op, n + 1, True))  # the siblings went on (and wait elsewhere, later)
        out[r] = RankTrace(rank=r, source="native", world_size=world, entries=calls,
                           groups={name: GroupInfo(name, m, False, "mesh_tp") for name, m in groups.items()},
                           stacks={"MainThread (1)": [Frame("<module>", USER, 1), Frame("tp", USER, 200)]},
                           hang=hang, dump_reason="hang", dump_time=1081.0)
    # what each member left: the skipper its recorder's trace (its watchdog's look is the evidence), the others
    # that or a Flight Recorder dump
    forms = {r: "native" if r == skipper else draw(st.sampled_from(["native", "pickle", "json"])) for r in out}
    job = Job(world=world, groups=groups, descs={g: "mesh_tp" for g in groups}, steps=[], faults={})
    return job, out, forms, ([skipper] if pairs > 1 else [0, 1])


@CHECKS
@given(skipped_in_a_pair())
def test_a_pair_waiting_at_one_number_is_a_type_mismatch_named_by_the_siblings(case):
    job, traces, forms, named = case
    with tempfile.TemporaryDirectory() as d:
        write(d, job, traces, forms, listed=False)  # as Gloo's dumps: groups named, and described, by the calls
        ts = load_traces([d], world_size=job.world)
    assert ts.errors == [], ts.errors
    report = analyze(ts)
    got = [(f.kind, f.ranks) for f in report.findings]
    assert got[0] == ("type_mismatch", named), [(f.kind, f.ranks, f.detail) for f in report.findings]
    assert not any(k == "order_deadlock" for k, _ in got), got


def test_the_real_tensor_parallel_run_names_the_rank_that_skipped():
    """`gloo-tp-skip-one-number`: rank 3 skipped its fourth call on the tensor-parallel group."""
    fired = truth("gloo-tp-skip-one-number")
    assert (fired["kind"], fired["rank"]) == ("skip", 3)
    _, report = diagnose_form("gloo-tp-skip-one-number", "rank_*.jsonl", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("type_mismatch", [3]), report["findings"]


def test_the_same_run_read_from_one_dump_a_rank_names_the_rank_that_skipped():
    """`gloo-tp-skip-one-number-mixed`: ranks 0 and 3 left their recorder's traces, rank 1 a pickle, rank 2 a JSON
    dump (it shows rank 2 in the broadcast; rank 3's watchdog shows it in the all_reduce)."""
    assert truth("gloo-tp-skip-one-number-mixed")["rank"] == 3
    _, report = diagnose_form("gloo-tp-skip-one-number-mixed", "*rank_*", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("type_mismatch", [3]), report["findings"]
