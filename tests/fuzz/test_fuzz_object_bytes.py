"""A rank that took another root for an object collective's broadcast sends its peers bytes that are no object's
sizes or pickle; Gloo checks no root, so they die turning them into objects (UnpicklingError, a buffer of 140 TB)
inside torch.distributed's object collective. Those deaths are the consequence, never the cause: where the dumps
show the roots (the recorder's) the root_mismatch names the culprit; where they do not (Gloo's Flight Recorder),
the dead ranks' finding is "one of" the call's members, the dead among them (crash.py, `unpacked_findings`): a
rank that skipped a part of an object collective dies of the next part's bytes too (fuzz run 71-283).
Real runs showed it: fuzz runs 72-130 and 73-30 (`reroot` on an objects job) read `crashed` of the receivers in
the Flight Recorder forms with the launcher's log, and in mixed forms."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.trace.model import Frame
from test_fuzz_invariant import CHECKS, _diagnose
from trace_sets import Job, Step

UNPICKLE = Frame("_tensor_to_object", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 3435)


@st.composite
def garbled_broadcast(draw) -> tuple[Job, int, list[int], dict[int, str]]:
    """(a job, the rank that took another root for a broadcast, the ranks that died of what it delivered, each
    rank's form): at least one of the dead leaves the recorder's trace, which holds its exception."""
    world = draw(st.integers(3, 8))
    n = draw(st.integers(2, 5))
    at = draw(st.integers(0, n - 2))
    steps = [Step("0", "broadcast", 8, root=0) if i == at else
             Step("0", draw(st.sampled_from(["all_reduce", "all_gather"])), 8) for i in range(n)]
    culprit = draw(st.integers(1, world - 1))
    receivers = [r for r in range(world) if r not in (0, culprit)]
    dead = draw(st.lists(st.sampled_from(receivers), min_size=1, max_size=len(receivers), unique=True))
    faults = {culprit: ("root", at), **{r: ("crash", at + 1) for r in dead}}
    forms = {r: draw(st.sampled_from(["native", "pickle", "json"])) for r in range(world)}
    forms[dead[0]] = "native"
    job = Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, faults,
              crash_text="UnpicklingError: invalid load key, '\\x00'.", crash_where=(UNPICKLE,))
    return job, culprit, sorted(dead), forms


@CHECKS
@given(garbled_broadcast())
def test_ranks_that_died_of_a_peers_bytes_never_lead_as_the_cause(case):
    job, culprit, dead, forms = case
    _, _, report = _diagnose(job, forms)
    first = report.findings[0]
    claimed = first.evidence.get("suspects") or first.ranks if first.evidence.get("undecided") else first.ranks
    assert culprit in claimed, [(f.kind, f.ranks, f.evidence, forms) for f in report.findings]
    if first.kind == "crashed":  # never decided: a rank that skipped a part of the call dies so too
        assert first.detail.startswith("one of ") and set(dead) <= set(claimed), first.detail
