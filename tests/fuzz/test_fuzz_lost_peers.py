"""Ranks with no trace beside a rank that, alive, never issued the call the others wait in (lost.py,
`hedge_lost`): Gloo aborts a process (SIGABRT, no dump) whose peer skips or changes a call, so the rank without a
trace may be the victim as well as the cause; the lost rank's finding says "one of ranks ..." and names both.
A real DDP run showed it: rank 1 skipped its loss all_reduce, rank 0 was aborted, and the recorder's dumps alone
read `missing_dump` [0] as if rank 0 alone had stopped the job. Over generated jobs (trace_sets.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.findings.kinds import fmt_ranks
from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS, _diagnose
from trace_sets import Job, Step


@st.composite
def lost_beside_a_stop(draw, stop: bool = True) -> Job:
    world = draw(st.integers(3, 8))
    steps = [Step("0", draw(st.sampled_from(["all_reduce", "all_gather", "barrier"])), 8)
             for _ in range(draw(st.integers(2, 5)))]
    a, b = draw(st.permutations(range(world)))[:2]
    faults = {a: ("no_dump", 0)}
    if stop:
        faults[b] = (draw(st.sampled_from(["stop", "skip"])), draw(st.integers(1, len(steps) - 1)))
    return Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, faults)


@CHECKS
@given(lost_beside_a_stop(), st.sampled_from(["native", "pickle", "json"]))
def test_a_lost_rank_beside_one_that_never_issued_the_call_is_one_of_two(job, form):
    (a, _), (b, (fault, _)) = job.faults.items()
    _, _, report = _diagnose(job, {r: form for r in range(job.world)})
    lost = next(f for f in report.findings if f.kind == "missing_dump")
    assert lost.ranks == [a]
    named = {r for f in report.findings for r in f.ranks}
    if b in named and fault == "stop":  # b alive and absent from the call the others wait in
        inside = [r for r in range(job.world) if r not in (a, b)]  # alone there, it may have issued one call more
        suspects = sorted({a, b} | (set(inside) if len(inside) == 1 else set()))
        assert lost.detail.startswith(f"one of {fmt_ranks(suspects)}: "), lost.detail
        assert lost.evidence["suspects"] == suspects and lost.evidence["undecided"] is True


@CHECKS
@given(lost_beside_a_stop(stop=False), st.sampled_from(["native", "pickle"]))
def test_a_lost_rank_alone_is_named_without_a_hedge(job, form):
    _, _, report = _diagnose(job, {r: form for r in range(job.world)})
    (a, _), = job.faults.items()
    first = report.findings[0]
    assert (first.kind, first.ranks) == ("missing_dump", [a]) and not first.detail.startswith("one of"), first.detail


@CHECKS
@given(lost_beside_a_stop(), st.sampled_from(["native", "pickle", "json"]))
def test_a_rank_whose_own_trace_shows_it_absent_comes_before_a_rank_without_a_trace(job, form):
    """A real DDP run (rank 1 skipped its loss all_reduce, Gloo aborted rank 0): the recorder's traces read
    `missing_dump [0]` first. Rank 1's own trace shows it absent from the call the others wait in; rank 0's absence
    of a dump says nothing of what it did: the evidence comes first, the hedged lost rank after it."""
    (a, _), (b, (fault, _)) = job.faults.items()
    _, _, report = _diagnose(job, {r: form for r in range(job.world)})
    lost = next(f for f in report.findings if f.kind == "missing_dump")
    first = report.findings[0]
    if lost.evidence.get("suspects_in_no_call"):  # b's own trace shows it went on past the call, the others agree
        assert first.kind == "missing_ranks" and b in first.ranks and a not in first.ranks, \
            [(f.kind, f.ranks) for f in report.findings]
    elif lost.evidence.get("undecided"):  # b merely never came (late or stopped before it): the two are one of
        assert first is lost and b in lost.evidence["suspects"], [(f.kind, f.ranks) for f in report.findings]


@st.composite
def extra_call_beside_a_lost_peer(draw) -> tuple[Job, int, int]:
    """(a job, the rank that issued one call twice, the peer that died of it): the one peer that had gone on to its
    next call took the extra call for it, and Gloo aborted it (no dump); every other rank was stopped on its way
    there (the launcher ended them). A real FSDP run showed it (fuzz run 72-114: rank 2 issued a reduce_scatter
    twice, rank 1 died in its loss all_reduce, ranks 0 and 3 were still in the optimizer step)."""
    world = draw(st.integers(3, 8))
    steps = [Step("0", draw(st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"])), 8)
             for _ in range(draw(st.integers(2, 5)))]
    w, lost = draw(st.permutations(range(world)))[:2]
    at = draw(st.integers(0, len(steps) - 2))
    faults = {r: ("stop", at + 1) for r in range(world)}
    faults.update({w: ("twice", at), lost: ("no_dump", 0)})
    return Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, faults), w, lost


@CHECKS
@given(extra_call_beside_a_lost_peer(), st.sampled_from(["native", "pickle", "json"]))
def test_a_rank_alone_in_a_call_beside_a_lost_peer_is_among_the_suspects(job, form):
    """The lone caller's extra call is what the lost peer may have died of; the members outside the call, behind
    or stopped, and the lost rank itself are the other readings. The first finding never leaves it out: "one of"
    them, the lone caller among them (lost.py, `_lone_caller`)."""
    job, w, lost = job
    _, _, report = _diagnose(job, {r: form for r in range(job.world)})
    first = report.findings[0]
    claimed = first.evidence.get("suspects") if first.evidence.get("undecided") else first.ranks
    assert w in claimed and lost in claimed, [(f.kind, f.ranks, f.evidence.get("suspects")) for f in report.findings]
    assert first.detail.startswith("one of ranks "), first.detail


def test_ranks_merely_late_to_the_call_do_not_outrank_the_rank_that_was_killed():
    """A real objects job, rank 0 SIGKILLed while ranks 1 and 3 were still building their optimizer (a slow
    import under load): they recorded no call yet; rank 2 waited in the first all_gather. Late is not absent:
    the killed rank leads, "one of" with the late ones (fixture `gloo-objects-late-peers`)."""
    _, report = diagnose_form("gloo-objects-late-peers", "rank_*.jsonl", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_dump", [0]), [(f["kind"], f["ranks"]) for f in report["findings"]]


def test_the_real_ddp_skip_names_the_rank_that_skipped_from_the_recorders_traces():
    """The run itself: DDP, 4 ranks, rank 1 skipped its loss all_reduce, Gloo aborted rank 0 (no dump)
    (`tests/fixtures/gloo-ddp-skip`)."""
    fired = truth("gloo-ddp-skip")
    _, report = diagnose_form("gloo-ddp-skip", "rank_*.jsonl", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [fired["rank"]]), report["findings"]
    lost = next(f for f in report["findings"] if f["kind"] == "missing_dump")
    assert lost["ranks"] == [0] and lost["detail"].startswith("one of ranks 0, 1: "), lost["detail"]
