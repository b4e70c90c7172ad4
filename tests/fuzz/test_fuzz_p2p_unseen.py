"""Pipelines whose ranks left different forms of dump, one rank having exited mid-way with its process group
alive. Gloo's Flight Recorder records no send/recv: an empty Gloo dump is absence of evidence for p2p, not a rank
that never posted its half. A real pipeline run (rank 0 exited at a step; ranks 1, 2 left Gloo's dumps, 0 and 3
the recorder's) read `missing_ranks [2]`, a false claim, because rank 3 waited in a recv from rank 2. The rank
that left is named, or the verdict says "one of ranks ..." with it among them; never another rank alone. Over
generated jobs (trace_sets.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import given

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces
from real_dumps import FIXTURES, diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import (HANG_THRESHOLD_S, analyzed, blocked_call, closed_under, dumped_for_hang, ground_truth,
                        left_alive, pipeline_closed, pipeline_left, pipeline_stopped, run, traces, write)


@CHECKS
@given(pipeline_left())
def test_a_rank_whose_dump_cannot_show_p2p_is_never_blamed_alone(case):
    job, left, forms = case
    ts_in = traces(job, run(job))
    ts_in[left] = left_alive(ts_in[left])
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, forms, p2p=False)
        ts = load_traces([d])
    report = analyze(ts)
    got = [(f.kind, f.ranks, f.detail[:160]) for f in report.findings]
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [left]], got  # a false claim
    if report.findings:
        first = report.findings[0]
        assert first.ranks == [left] or (first.detail.startswith("one of") and left in first.ranks), got


def test_the_real_pipeline_run_names_the_rank_that_exited_in_its_mix_of_forms():
    """The run itself: a 4-rank pipeline, rank 0 exited with code 3 at a step; ranks 0 and 3 left the recorder's
    traces, 1 and 2 Gloo's Flight Recorder dumps, empty (`tests/fixtures/gloo-pipeline-exit-mixed`)."""
    fired = truth("gloo-pipeline-exit-mixed")
    _, report = diagnose_form("gloo-pipeline-exit-mixed", "rank_*", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [fired["rank"]]), report["findings"]
    assert "exited with its process group alive" in first["detail"], first["detail"]
    assert not [f for f in report["findings"] if f["ranks"] in ([1], [2])], report["findings"]


@CHECKS
@given(pipeline_closed())
def test_the_peer_whose_connection_closed_first_is_named_only_when_the_others_were_seen_after(case):
    """The rank that ended left an empty Gloo dump; a neighbour blocked in a send/recv with it died of the closed
    connection (or did not), and the other ranks dumped later. The rank that ended is named alone only where the
    traces prove it: a rank saw it close, every other rank whose dump cannot show p2p was still connected to a
    blocked rank later, and no watchdog called the job hung (a timeout ends ranks too); else "one of", with it."""
    job, left, forms, closing, hung = case
    ran = run(job)
    ts_in = traces(job, ran)
    for r, t in ts_in.items():
        pending = [e for e in t.entries if e.state != "completed"]
        t.dump_time = 1010.0
        t.hang = {"status": "confirmed", "detected_at": 1009.0} if hung else None
        if r in closing and pending and pending[0].peer == left:
            ts_in[r] = closed_under(t, 1005.0)
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, forms, p2p=False)
        report = analyze(load_traces([d]))
    got = [(f.kind, f.ranks, f.detail[:200]) for f in report.findings]
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [left]], got  # a false claim
    decided = [f for f in report.findings if "ended first" in f.detail]
    if decided:
        assert not hung and any(forms[r] == "native" and r in closing for r in range(job.world)), got
        assert all(f.ranks == [left] for f in decided), got


def test_the_real_pipeline_run_names_the_stage_whose_connection_closed_first():
    """A 4-rank pipeline, rank 1 exited with code 3 mid-step; ranks 1, 2 left Gloo's dumps (empty), 0 and 3 the
    recorder's. Rank 0 died in its send to rank 1 of "Connection closed by peer"; rank 3, dumped later, still
    waited in its recv from rank 2: rank 2 was still there when rank 1 had gone (`gloo-pipeline-exit-closed`).
    With rank 3's dump moved before rank 0's failure, nothing shows rank 2 outlived rank 1: "one of" again."""
    fired = truth("gloo-pipeline-exit-closed")
    assert (fired["kind"], fired["rank"]) == ("exit", 1)
    _, report = diagnose_form("gloo-pipeline-exit-closed", "rank_*", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [1]), report["findings"]
    assert "rank 1 ended first" in first["detail"], first["detail"]
    with tempfile.TemporaryDirectory() as d:
        for f in (FIXTURES / "gloo-pipeline-exit-closed").glob("rank_*"):
            shutil.copy(f, Path(d) / f.name)
        ts = load_traces([d], world_size=4)
        ts.ranks[3].dump_time = ts.ranks[0].dump_time - 1.0
        first = analyze(ts).findings[0]
    assert first.ranks == [1, 2] and first.detail.startswith("one of"), (first.ranks, first.detail)


def test_the_first_stage_a_signal_ended_is_among_the_suspects():
    """A 4-rank pipeline, SIGTERM to rank 3 (the recorder's trace: between two steps, in no call); ranks 1, 2 left
    Gloo's dumps (empty); rank 0 waits in a recv from rank 1 until the launcher's SIGTERM. Rank 3 waits for
    nobody, yet it may be what the unseen sends and receives wait for: it is among the suspects, never left out
    for ranks the dumps cannot show (`gloo-pipeline-sigterm-first`). The launcher's wave follows a first SIGTERM
    by as little as 0.06 s in the campaign's runs, and spreads over up to 0.22 s: the time does not decide."""
    fired = truth("gloo-pipeline-sigterm-first")
    assert (fired["kind"], fired["rank"], fired["arg"]) == ("kill", 3, "SIGTERM")
    _, report = diagnose_form("gloo-pipeline-sigterm-first", "rank_*", 4)
    first = report["findings"][0]
    assert first["ranks"] == [1, 2, 3] and first["detail"].startswith("one of"), report["findings"]
    assert "rank 3 is the first a signal ended" in first["detail"], first["detail"]


@CHECKS
@given(pipeline_stopped())
def test_a_rank_its_own_watchdog_saw_in_no_call_through_the_hang_is_named_and_never_left_out(case):
    """A stage stopped in Python (a data loader, a sleep); the others wait along the chain, some behind ranks whose
    Gloo dumps cannot show p2p. A rank whose dump shows p2p, in no call and not at its end, may be where a chain
    of waits ends: it is never left out of the suspects. Where its own watchdog saw it in no call for the hang's
    threshold, it waits for nobody while the others wait: it is named, alone, as the rank the hang waits for,
    even where no dump shows anyone waiting, and never as one a signal ended: the run's SIGTERM after the hang
    is its stop. Real runs named the two stages the dumps could not show instead
    (`gloo-pipeline-hang-stopped-mixed`), and the stopped rank as `crashed` by that SIGTERM (71-84)."""
    job, stopped, forms, idle, numbered = case
    ran = run(job)
    ts_in = traces(job, ran)
    blocked, _ = ground_truth(job, ran)
    episode = _episode(ts_in, blocked, numbered)
    for r, t in ts_in.items():
        ts_in[r] = dumped_for_hang(t, idle if r == stopped else 0.0, hung=idle > 0,
                                   done=r != stopped and r not in blocked, episode=episode)
    report = analyzed(job, ts_in, forms, p2p=False)
    got = [(f.kind, f.ranks, f.detail[:200]) for f in report.findings]
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [stopped]], got  # a false claim
    assert not [f for f in report.findings if "#None" in f.detail], got  # a call without a number reads as none
    seen = [r for r in ts_in if forms[r] == "native" and (r == stopped or r in blocked)]
    if not blocked or not seen:
        return  # it stopped where nobody needed it, or no dump shows it or a rank waiting: nothing false said
    assert report.findings, got
    first = report.findings[0]
    assert first.ranks == [stopped] or (first.detail.startswith("one of") and stopped in first.ranks), got
    if forms[stopped] == "native" and idle >= HANG_THRESHOLD_S:
        assert (first.kind, first.ranks) == ("missing_ranks", [stopped]), got  # the stop after it is no cause


def _episode(ts: dict, blocked, numbered: bool) -> dict:
    """The hang's episode as each header records it: the first blocked rank detected it, in its call, numbered
    or not."""
    if not blocked:
        return {}
    detector = min(blocked)
    call = blocked_call(ts[detector])
    if call is not None and not numbered:
        call["seq"] = None
    return {"detected_by": detector, "blocked_in": call}


def test_the_real_pipeline_run_names_the_stage_its_watchdog_saw_stopped():
    """A 4-rank pipeline, rank 0 slept at a step (`hang:0:sleep@step=4`); ranks 0 and 3 left the recorder's traces,
    1 and 2 Gloo's Flight Recorder dumps (no send/recv). Rank 3 waits in a recv from rank 2; rank 0's watchdog saw
    it in no call for 31 s of the confirmed hang (`gloo-pipeline-hang-stopped-mixed`)."""
    _names_the_stage_that_slept("gloo-pipeline-hang-stopped-mixed")


def test_the_real_pipeline_run_names_the_stage_its_watchdog_saw_stopped_where_no_dump_shows_a_wait():
    """A 4-rank pipeline, rank 1 slept at a step (`hang:1:sleep@step=2`); rank 1 left the recorder's trace, the
    others Gloo's Flight Recorder dumps (no send/recv): no dump shows a rank waiting. Rank 1's watchdog saw it
    in no call for 31 s of the confirmed hang; `run --kill-on-hang` then ended it by SIGTERM, which read as the
    cause, `crashed` (`gloo-pipeline-hang-alone-mixed`)."""
    report = _names_the_stage_that_slept("gloo-pipeline-hang-alone-mixed")
    assert not [f for f in report["findings"] if f["kind"] == "crashed"], report["findings"]


def _names_the_stage_that_slept(fixture: str) -> dict:
    """The report of a real pipeline run whose stage slept: its first finding names that stage as the rank the
    hang waits for, by what its own watchdog saw."""
    fired = truth(fixture)
    assert fired["kind"] == "hang"
    _, report = diagnose_form(fixture, "rank_*", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [fired["rank"]]), report["findings"]
    assert "its own watchdog saw it in no call for 31 s" in first["detail"], first["detail"]
    return report
