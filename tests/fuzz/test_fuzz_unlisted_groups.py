"""Groups a dump names without their members: Gloo's Flight Recorder writes a pg_config that lists no group, so a
group's members are inferred from the ranks whose dumps issued on it (trace/loaders, `_infer_groups`). A member
that left no dump (SIGKILL) is missing from that list: the group is larger than its traced members, by how much
the dumps do not say. The size rules of all_gather and reduce_scatter (output = n x input, input = n x output)
hold for the group's real size, which is then known only to lie between its traced members and the world:
match.py's `GroupView.sizes_fit`. Taking the group for its traced members alone read a survivor's all_gather
(output 2 x input, in a shard group of two that lost one) as a `size_mismatch`, ahead of the lost rank.

Over generated HSDP jobs (a replicate x shard mesh: FSDP's all_gather and reduce_scatter on the shard groups, the
gradient all_reduce on the replicate groups, a loss all_reduce on the world) written as Gloo's Flight Recorder
writes them (no members, no send/recv): one rank killed (it stops and leaves no dump) is the first finding and
nothing claims a size mismatch; the healthy job reads OK; a rank that resized one all_gather is still named.
And over a real run's dumps kept as a fixture (fuzz/jobs.py's `hsdp` under `distdoctor run --inject
kill:1:SIGKILL@step=3`, 4 ranks over gloo, 2 x 2 mesh), in each form alone and in every mix of forms per rank:
there the recorder's reduce_scatter meets Gloo's record of it, an all_reduce of its whole input (diagnose/renamed.py).
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces

from real_dumps import FIXTURES, diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import Job, Step, run, traces, write


def _mesh(rep: int, shard: int) -> tuple[dict, dict]:
    """The world, the shard groups (consecutive ranks) and the replicate groups (strided), as a DeviceMesh makes
    them, with its descriptions."""
    groups, descs = {"0": list(range(rep * shard))}, {"0": "default_pg"}
    for i in range(rep):
        groups[str(1 + i)], descs[str(1 + i)] = [i * shard + j for j in range(shard)], "mesh_shard"
    for j in range(shard):
        groups[str(1 + rep + j)], descs[str(1 + rep + j)] = [i * shard + j for i in range(rep)], "mesh_replicate"
    return groups, descs


def _dim(groups: dict, descs: dict, desc: str) -> list[str]:
    return [g for g in groups if descs[g] == desc]


@st.composite
def hsdp_jobs(draw, fault: str = "kill") -> tuple[Job, int]:
    """(job, the faulty rank): `kill` stops a rank before a call (its dump is dropped by the caller), `size`
    doubles one of its shard all_gathers, `none` changes nothing."""
    rep, shard = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (2, 4), (4, 2)]))
    groups, descs = _mesh(rep, shard)
    shards, reps = _dim(groups, descs, "mesh_shard"), _dim(groups, descs, "mesh_replicate")
    layers = [draw(st.sampled_from([4, 8, 16])) for _ in range(draw(st.integers(1, 3)))]
    steps: list[Step] = []
    for _ in range(draw(st.integers(1, 3))):  # training steps: forward, backward, the logged loss
        steps += [Step(g, "all_gather", s) for s in layers for g in shards]
        for s in reversed(layers):
            steps += [Step(g, "all_gather", s) for g in shards] + [Step(g, "reduce_scatter", s) for g in shards]
            steps += [Step(g, "all_reduce", s) for g in reps]
        steps.append(Step("0", "all_reduce", 1))
    rank = draw(st.integers(0, rep * shard - 1))
    if fault == "kill":
        faults = {rank: ("stop", draw(st.integers(0, len(steps) - 1)))}
    elif fault == "size":
        mine = [k for k, s in enumerate(steps) if s.op == "all_gather" and rank in groups[s.group]]
        faults = {rank: ("size", draw(st.sampled_from(mine)))}
    else:
        faults = {}
    return Job(rep * shard, groups, descs, steps, faults), rank


def _report(job: Job, form: str, lost: int | None = None):
    ts_in = traces(job, run(job))
    ts_in.pop(lost, None)  # killed: no dump
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, {r: form for r in ts_in}, p2p=False, listed=False)
        ts = load_traces([d], world_size=job.world)  # the user gives the job's size (`--world-size`)
    assert ts.errors == [], ts.errors
    return analyze(ts)


@CHECKS
@given(hsdp_jobs(), st.sampled_from(["pickle", "json"]))
def test_a_killed_member_of_an_unlisted_group_is_the_finding_not_its_peers_sizes(case, form):
    job, rank = case
    report = _report(job, form, lost=rank)
    kinds = [(f.kind, f.ranks, f.group, f.op, f.seq) for f in report.findings]
    assert not any(f.kind == "size_mismatch" for f in report.findings), kinds
    first = report.findings[0]
    assert first.kind in ("missing_dump", "missing_ranks") and first.ranks == [rank], kinds


@CHECKS
@given(hsdp_jobs(fault="none"), st.sampled_from(["pickle", "json"]))
def test_a_healthy_job_with_unlisted_groups_reads_ok(case, form):
    job, _ = case
    report = _report(job, form)
    assert report.verdict == "ok", [(f.kind, f.ranks, f.detail) for f in report.findings]


@CHECKS
@given(hsdp_jobs(fault="size"), st.sampled_from(["pickle", "json"]))
def test_a_resized_all_gather_in_an_unlisted_group_is_still_named(case, form):
    job, rank = case
    first = _report(job, form).findings[0]
    assert (first.kind, first.ranks, first.op) == ("size_mismatch", [rank], "all_gather"), first.detail


def test_a_real_hsdp_rank_killed_is_named_from_flight_recorder_dumps_alone():
    fired = truth("gloo-hsdp-sigkill")
    assert (fired["kind"], fired["arg"], fired["rank"]) == ("kill", "SIGKILL", 1)
    for pattern in ("rank_*.fr.pkl", "json/rank_*.fr.json"):
        report = diagnose_form("gloo-hsdp-sigkill", pattern, 4)[1]
        kinds = [(f["kind"], f["ranks"]) for f in report["findings"]]
        assert not any(k == "size_mismatch" for k, _ in kinds), (pattern, kinds)
        assert kinds[0] in (("missing_dump", [1]), ("missing_ranks", [1])), (pattern, kinds)


def test_a_real_hsdp_rank_killed_is_named_whatever_forms_the_survivors_left():
    base = FIXTURES / "gloo-hsdp-sigkill"
    forms = {"recorder": "rank_{}.jsonl", "pickle": "rank_{}.fr.pkl", "json": "json/rank_{}.fr.json"}
    for mix in itertools.product(forms, repeat=3):
        with tempfile.TemporaryDirectory() as d:
            for rank, form in zip((0, 2, 3), mix):
                f = base / forms[form].format(rank)
                shutil.copy(f, Path(d) / f.name)
            ts = load_traces([d], world_size=4, jobs=1)
        report = analyze(ts)
        kinds = [(f.kind, f.ranks) for f in report.findings]
        assert kinds[0] == ("missing_dump", [1]) and all(k != "size_mismatch" for k, _ in kinds), (mix, kinds)
