"""A rank that took another root for an object collective's broadcast sends its peers bytes that are no object's
sizes or pickle; Gloo checks no root, so they die turning them into objects (UnpicklingError, a buffer of 140 TB)
inside torch.distributed's object collective. Those deaths are the consequence, never the cause: where the dumps
show the roots (the recorder's) the root_mismatch names the culprit; where they do not (Gloo's Flight Recorder),
the dead ranks' finding is "one of" the call's members, the dead among them (crash.py, `unpacked_findings`): a
rank that skipped a part of an object collective dies of the next part's bytes too (fuzz run 71-283).
Real runs showed it: fuzz runs 72-130 and 73-30 (`reroot` on an objects job) read `crashed` of the receivers in
the Flight Recorder forms with the launcher's log, and in mixed forms. And the other side of it: a rank that
skipped a part and died reading the buffer it never filled, after parts every member completed alike, is named
alone (object_parts.py; fuzz runs 75-67, 75-72)."""

from __future__ import annotations

import os
import tempfile

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.trace.model import Frame
from test_fuzz_invariant import CHECKS, _diagnose
from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces
from trace_sets import PEER_CLOSED, USER, Job, Step, _render, pipeline_rounds, run, traces, write

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
              crash_text="UnpicklingError: invalid load key, '\\x00'.",
              crash_where=(Frame("step", USER, 101 + at), UNPICKLE))  # in the statement's next part
    return job, culprit, sorted(dead), forms


@st.composite
def skipped_object_part(draw) -> tuple[Job, int, dict[int, str]]:
    """(a job, the rank that skipped a part of an object collective, each rank's form): the collective's two parts
    (sizes, then bytes: a broadcast or an all_gather each) among other calls; the rank completes every call
    before the part it skips and dies right there, reading the buffer that part never filled. Its trace is the
    recorder's (which holds its exception); the others' any form."""
    world = draw(st.integers(2, 8))
    n = draw(st.integers(0, 3))
    op = draw(st.sampled_from(["broadcast", "all_gather"]))
    part = Step("0", op, 1, root=0 if op == "broadcast" else None)
    data = Step("0", op, 8, root=0 if op == "broadcast" else None)
    steps = [Step("0", draw(st.sampled_from(["all_reduce", "all_gather"])), 8) for _ in range(n)] + [part, data]
    steps += [Step("0", "all_reduce", 8) for _ in range(draw(st.integers(0, 2)))]
    skipped = draw(st.sampled_from([n, n + 1]))  # the sizes part, or the bytes part
    w = draw(st.integers(0, world - 1))
    forms = {r: draw(st.sampled_from(["native", "pickle", "json"])) for r in range(world)}
    forms[w] = "native"
    job = Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, {w: ("crash", skipped)},
              crash_text="UnpicklingError: could not find MARK", crash_where=(Frame("step", USER, 100 + skipped),
                                                                              UNPICKLE))
    return job, w, forms


@CHECKS
@given(skipped_object_part())
def test_a_rank_that_died_of_a_part_it_never_issued_is_named_alone(case):
    """Fuzz runs 75-67 and 75-72 (`objects`, skip): the rank skipped the sizes or the bytes part and died reading
    the buffer it never filled; every member completed the parts before it alike, so no peer's root or size went
    wrong: the skipper is named alone, not "one of" every member (object_parts.py). Where a peer's root is not
    recorded (Flight Recorder's dump of a broadcast), nothing excludes a wrong root: still "one of"."""
    job, w, forms = case
    _, _, report = _diagnose(job, forms)
    first = report.findings[0]
    got = [(f.kind, f.ranks, f.detail[:160]) for f in report.findings]
    rooted_unseen = any(s.op == "broadcast" for s in job.steps) and any(forms[r] != "native" for r in forms)
    if first.evidence.get("undecided"):
        assert rooted_unseen and w in first.evidence["suspects"], got
    elif first.kind == "missing_ranks":  # it died before its first call on the group: absent, alone
        assert first.ranks == [w] and not [e for e in report.traces.ranks[w].entries if e.group == "0"], got
    else:
        assert (first.kind, first.ranks) == ("crashed", [w]) and "skipped that part" in first.detail, got


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


@st.composite
def unpacked_in_a_pipeline(draw) -> tuple[Job, int, dict[int, str]]:
    """(a pipeline job, the stage that died turning what a recv delivered into objects - recv_object_list, a
    schedule's shape exchange -, each rank's form): the stage leaves the recorder's trace, which holds its
    exception; the others any form, Gloo's Flight Recorder ones showing no send or recv at all."""
    world = draw(st.integers(2, 6))
    steps = pipeline_rounds(world, draw(st.integers(1, 3)))
    w = draw(st.integers(0, world - 1))
    mine = [i for i, s in enumerate(steps) if w in (s.src, s.dst)]
    at = draw(st.sampled_from(mine[1:] or mine))
    forms = {r: draw(st.sampled_from(["native", "pickle", "json"])) for r in range(world)}
    forms[w] = "native"
    faults = {w: ("crash", at)}
    for peer in (w - 1, w + 1):  # its neighbours die of the connection its death closed, at their next call
        later = [i for i, s in enumerate(steps) if i > at and peer in (s.src, s.dst)]
        if 0 <= peer < world and later and draw(st.booleans()):
            faults[peer] = ("crash", later[0])
    closed = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:11177"
    job = Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, faults,
              crash_text="UnpicklingError: invalid load key, '\\x00'.", crash_where=(UNPICKLE,),
              crash_texts={r: closed for r in faults if r != w})
    return job, w, forms


@CHECKS
@given(unpacked_in_a_pipeline())
def test_a_stage_that_died_of_a_messages_bytes_is_one_of_it_and_its_peer(case):
    """Fuzz run 75-220 (GPipe on 8 ranks, `skip:1`): the stage died unpickling what a recv delivered; its peers
    died of the connection it closed, and the launcher's log gives every exception while Gloo's Flight Recorder
    dumps hold no call. The unpacking death made no finding (a p2p call's, or none at all), and the peers' closed
    connections were named `crashed`, a false claim. The bytes came from the recv's peer, or the stage skipped a
    part itself: "one of" the two; with no call in its dump, "one of" every rank; the first finding never leaves
    the stage out (its neighbours' closed connections echo it: crash.py, `unpacked_findings`, explain.py)."""
    job, w, forms = case
    _, _, report = _diagnose(job, forms)
    first = report.findings[0]
    got = [(f.kind, f.ranks, f.detail[:160]) for f in report.findings]
    assert w in (first.evidence.get("suspects") or first.ranks), got  # never a finding that leaves it out


def _unpacking_log(world: int, w: int, echoes: set[int]) -> str:
    """torchrun's log of a job whose rank `w` died unpickling a recv's bytes inside torch.distributed's object
    collective (exit code 1, the agent's first failure), its `echoes` of the connection it closed (their
    tracebacks shown; the launcher's SIGTERM ends them), the rest stopped by the launcher."""
    pid = {r: 4000 + r for r in range(world)}
    stamp = "W1129 17:31:10.207000 10218 site-packages/torch/distributed/elastic/multiprocessing/api.py"
    frames = ['  File "/job/train.py", line 147, in pipeline', '    schedule.step()',
              f'  File "{UNPICKLE.filename}", line {UNPICKLE.line}, in {UNPICKLE.name}',
              '    return _unpickler(io.BytesIO(buf)).load()']
    lines = [f"[rank{w}]: {ln}" for ln in ["Traceback (most recent call last):", *frames,
                                           "_pickle.UnpicklingError: invalid load key, '\\x00'."]]
    for r in sorted(echoes):
        lines += [f"[rank{r}]: {ln}" for ln in ["Traceback (most recent call last):", *frames[:2], PEER_CLOSED]]
    lines += [f"{stamp}:1028] Sending process {pid[r]} closing signal SIGTERM" for r in range(world) if r != w]
    lines.append(f"E1129 17:31:10.745000 10218 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] "
                 f"failed (exitcode: 1) local_rank: {w} (pid: {pid[w]}) of binary: python")
    return _render(lines, {r: (1, None) if r == w else (-15, "SIGTERM") for r in range(world)}, pid, w)


@CHECKS
@given(st.data())
def test_a_stage_that_died_of_a_messages_bytes_beside_blind_dumps_is_no_claim_for_its_echoes(data):
    """Fuzz run 75-220 itself: every rank left Gloo's Flight Recorder dump (no call of a pipeline), the launcher's
    log gives the exceptions - the stage's UnpicklingError, raised in the object collective, the first failure;
    its neighbours' closed connections. They read `crashed [0, 2]`, a false claim: the unpacking death made no
    finding without a call to hang it on. It is now "one of" every rank, the neighbours its echoes."""
    world = data.draw(st.integers(3, 8))
    w = data.draw(st.integers(0, world - 1))
    echoes = {r for r in (w - 1, w + 1) if 0 <= r < world and data.draw(st.booleans())} or \
        {w + 1 if w + 1 < world else w - 1}
    job = Job(world, {"0": list(range(world))}, {"0": "default_pg"}, pipeline_rounds(world, 2), {})
    forms = {r: data.draw(st.sampled_from(["pickle", "json"])) for r in range(world)}
    ts_in = traces(job, run(job))
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, forms, p2p=False)
        with open(os.path.join(d, "torchrun.log"), "w") as f:
            f.write(_unpacking_log(world, w, echoes))
        report = analyze(load_traces([d], world_size=world))
    first = report.findings[0]
    got = [(f.kind, f.ranks, f.detail[:160]) for f in report.findings]
    assert first.kind == "crashed" and first.ranks == [w] and first.evidence.get("undecided"), got
    assert set(first.evidence["suspects"]) == set(range(world)) and first.detail.startswith("one of"), got
