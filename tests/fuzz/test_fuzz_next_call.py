"""A rank of a 2-D mesh that issues one of its shard group's calls twice (FSDP's reduce_scatter under HSDP,
`twice` on a real job: fuzz runs 74-124 and 74-172) waits alone in its group's last call while its group's other
members went on into the replicate group's all_reduce and the loss's, and wait there. Every form of dump read
`missing_ranks` of the other members, a false claim. What each member did right after its call before says who
departs (diagnose/next_call.py). Over generated meshes (trace_sets.py): rows are the shard groups, columns the
replicate groups, each module a reduce_scatter on every row and an all_reduce on every column, each round a loss
all_reduce on the world; one rank issues one of its reduce_scatters twice; every rank leaves one form of dump.
And the same meshes stopped from outside with one rank ahead of the others (fuzz run 71-205): no rank named for a
call the others, standing in no call, may yet make."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.report.diagnose_text import render_text
from test_fuzz_invariant import CHECKS, _diagnose
from trace_sets import Job, Step


def _mesh_program(draw) -> tuple[int, dict, dict, list[Step]]:
    rows, cols = draw(st.integers(2, 3)), draw(st.integers(2, 3))
    world = rows * cols
    groups = {"0": list(range(world))}
    descs = {"0": "default_pg"}
    for i in range(rows):
        groups[str(1 + i)], descs[str(1 + i)] = [i * cols + j for j in range(cols)], "mesh_shard"
    for j in range(cols):
        groups[str(1 + rows + j)], descs[str(1 + rows + j)] = [i * cols + j for i in range(rows)], "mesh_replicate"
    steps = []
    for _ in range(draw(st.integers(1, 2))):
        for _ in range(draw(st.integers(1, 3))):  # modules
            steps += [Step(str(1 + i), "reduce_scatter", 8 * cols) for i in range(rows)]
            steps += [Step(str(1 + rows + j), "all_reduce", 8) for j in range(cols)]
        steps.append(Step("0", "all_reduce", 1))
    return world, groups, descs, steps


@st.composite
def mesh_twice(draw) -> tuple[Job, int, dict[int, str]]:
    world, groups, descs, steps = _mesh_program(draw)
    w = draw(st.integers(0, world - 1))
    mine = [i for i, s in enumerate(steps) if s.op == "reduce_scatter" and w in groups[s.group]]
    job = Job(world, groups, descs, steps, {w: ("twice", draw(st.sampled_from(mine)))})
    forms = {r: draw(st.sampled_from(["native", "pickle", "json"])) for r in range(world)}
    return job, w, forms


@CHECKS
@given(mesh_twice())
def test_a_rank_alone_in_a_call_its_group_and_siblings_went_past_is_named(case):
    job, w, forms = case
    _, _, report = _diagnose(job, forms)
    got = [(f.kind, f.ranks) for f in report.findings]
    assert report.findings and report.findings[0].ranks == [w], got
    assert not [f for f in report.findings if f.kind == "missing_ranks" and w not in f.ranks
                and f is report.findings[0]], got
    # the loss's all_reduce waits for the lone caller, which never issued it: never "every other member issued it"
    assert "issued it too" not in render_text(report), render_text(report)


@st.composite
def mesh_ahead(draw) -> tuple[Job, int, dict[int, str]]:
    """Every rank but one stops (a job stopped from outside, ranks caught where each stood) right before a module
    whose first call is a shard group's: the one left goes on into its own shard group's call and waits there
    alone, while the others stand in no call, their last a replicate group's. It is ahead, and did nothing."""
    world, groups, descs, steps = _mesh_program(draw)
    firsts = [i for i, s in enumerate(steps) if i and s.op == "reduce_scatter" and steps[i - 1].op != "reduce_scatter"]
    if not firsts:
        firsts = [len(steps) - 1]
    at = draw(st.sampled_from(firsts))
    ahead = draw(st.integers(0, world - 1))
    job = Job(world, groups, descs, steps, {r: ("stop", at) for r in range(world) if r != ahead})
    return job, ahead, {r: draw(st.sampled_from(["native", "pickle", "json"])) for r in range(world)}


@CHECKS
@given(mesh_ahead())
def test_a_rank_ahead_of_ranks_in_no_call_is_not_the_one_that_departed(case):
    """Fuzz run 71-205 (tensor parallel, 8 ranks): the rank further along than two stopped ones was named for
    issuing one call more, its 'voters' standing in no call. A rank in no call may yet make the call: no vote."""
    job, ahead, forms = case
    _, _, report = _diagnose(job, forms)
    assert report.findings
    assert not [f for f in report.findings if f.evidence.get("parted") == "next_call"], \
        [(f.kind, f.ranks, f.detail) for f in report.findings]
    assert report.findings[0].ranks != [ahead], [(f.kind, f.ranks) for f in report.findings]
