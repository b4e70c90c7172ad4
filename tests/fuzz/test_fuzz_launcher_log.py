"""torchrun's console log as evidence: how each rank ended, which ranks the launcher stopped, what each raised.

Gloo's Flight Recorder dumps of a pipeline hold no call, and no dump of that form says how its process ended:
four empty files read `undecided` even when a rank had exited with a code, raised or been signalled. The log the
launcher leaves says so (trace/loaders/launcher_log.py). Over generated pipelines whose ranks left Flight
Recorder's dumps or the recorder's, and generated logs of every way the first rank can go (trace_sets.launched),
one log or one a host (each agent's own pids, which may repeat across hosts):
the rank the log shows ended on its own is named alone; a rank the launcher stopped, a rank that died of the
closed connection, is never named alone; the one rank that went before the launcher's signal is named even when
its traceback is cut from the log; where the log cannot decide (the agent was told to stop first) it adds no
claim, and where two ranks went first, one of them of what the log does not show, it says "one of" them. And the real runs: a pipeline's Flight Recorder pickles with
its torchrun log, read as a user would give them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.loaders.launcher_log import load_launcher_log, looks_like_launcher_log
from real_dumps import FIXTURES, truth
from test_fuzz_invariant import CHECKS
from trace_sets import (closed_under, ground_truth, jobs, launch_ends, launched, launcher_log, pipeline_left,
                        render_launch, run, traces, write)


def _diagnose(job, left, forms, end, hosts=1):
    ts_in = traces(job, run(job))
    for r, t in list(ts_in.items()):
        t.dump_time, t.dump_reason, t.stacks = None, None, {}
        if forms[r] != "native":
            continue
        t.dump_time = 1010.0 + r / 100
        if r in end["echoes"] and not end["told"]:
            ts_in[r] = closed_under(t, 1005.0)
        else:
            t.dump_reason = "signal: SIGTERM"  # the launcher's, whatever the time says
    if end["how"] == "killed" and not end["told"]:
        del ts_in[left]  # SIGKILL: no dump
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, forms, p2p=False)
        ends = launch_ends(job.world, left, end)
        per_host = job.world // hosts + (job.world % hosts > 0)
        for h in range(hosts):  # one agent a host, each with its own log (and its own pids: they may repeat)
            mine = {r: e for r, e in ends.items() if r // per_host == h}
            with open(os.path.join(d, f"torchrun-{h}.log"), "w") as f:
                f.write(render_launch(mine, end["pid0"], told=end["told"], first=left))
        return analyze(load_traces([d], world_size=job.world))


@CHECKS
@given(st.data())
def test_the_rank_the_launchers_log_says_went_first_is_named_and_no_other_alone(data):
    job, left, _ = data.draw(pipeline_left())
    forms = {r: data.draw(st.sampled_from(["pickle", "json", "native"])) for r in range(job.world)}
    forms[left] = data.draw(st.sampled_from(["pickle", "json"]))
    end = data.draw(launched(job.world, left))
    report = _diagnose(job, left, forms, end, hosts=data.draw(st.sampled_from([1, 1, 2])))
    got = [(f.kind, f.ranks, f.detail[:200]) for f in report.findings]
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [left]], got  # a false claim
    if end["told"]:
        return  # the job was stopped from outside: the log says no rank went first
    assert report.findings and report.findings[0].kind in ("crashed", "missing_dump", "missing_ranks"), got
    if end["cut_echo"] is None:
        assert report.findings[0].ranks == [left], (end, forms, got)
    else:  # two ranks went before the launcher's signal, one of them of what the log does not show
        assert left in report.findings[0].ranks, (end, forms, got)


def test_the_account_reads_every_line_torchrun_writes_of_an_end():
    end = {"how": "raise", "echoes": {1}, "told": False, "cut": False, "cut_echo": None, "handler": {3}, "pid0": 500}
    text = launcher_log(4, 2, end).encode()
    assert looks_like_launcher_log(text[:4096], text[-4096:])
    log = load_launcher_log(text, "torchrun.log")
    got = {r: (e.ended, e.exitcode, e.signal, e.stopped) for r, e in log.ranks.items()}
    assert got == {0: ("stopped", -15, "SIGTERM", True), 1: ("exception", -15, "SIGTERM", True),
                   2: ("exception", 1, None, False), 3: ("stopped", 143, "SIGTERM", True)}, got
    assert log.ranks[2].exception == "ValueError: the batch holds no labels"
    assert str(log.ranks[2].frames[-1]).endswith("schedules.py:683)") and log.ranks[2].first_seen
    assert log.ranks[1].exception.startswith("RuntimeError: [pair.cc:553] Connection closed by peer")


def test_a_log_that_names_no_end_is_one_clear_load_error(tmp_path):
    (tmp_path / "torchrun.log").write_text("[rank0]: hello\n[rank1]: hello\n")
    ts = load_traces([str(tmp_path)])
    assert [e.reason for e in ts.errors] == [
        "a torchrun log, but it names no rank's end (no failure summary, no traceback)"], ts.errors


def _given(fixture: str, names: list[str], world: int) -> dict:
    """The JSON report of `diagnose` on these files of a real run's fixture, as a user gives them."""
    with tempfile.TemporaryDirectory() as d:
        for name in names:
            (Path(d) / name).write_bytes((FIXTURES / fixture / name).read_bytes())
        proc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", d, "--world-size", str(world),
                               "--format", "json"], capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout)


def _pickles(world: int) -> list[str]:
    return [f"rank_{r}.fr.pkl" for r in range(world)]


@pytest.mark.parametrize("fixture,world,kind", [("gloo-pipeline-exit-log", 4, "exit"),
                                                ("gloo-pipeline8-raise-log", 8, "raise"),
                                                ("gloo-pipeline-sigterm-log", 4, "kill")])
def test_real_pipelines_flight_recorder_pickles_with_their_torchrun_log_name_the_rank(fixture, world, kind):
    """Real 4- and 8-rank pipelines (Gloo): a stage exited with code 3, raised, or was sent SIGTERM; every Flight
    Recorder pickle is empty. Alone they are `undecided`; with the job's torchrun log, the stage is named."""
    fired = truth(fixture)
    assert fired["kind"] == kind
    alone = _given(fixture, _pickles(world), world)
    assert alone["verdict"] == "undecided" and not alone["findings"], alone["findings"]
    report = _given(fixture, _pickles(world) + ["torchrun.log"], world)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("crashed", [fired["rank"]]), report["findings"]
    assert not [f for f in report["findings"] if len(f["ranks"]) == 1 and f["ranks"] != [fired["rank"]]]
    assert report["launcher"]["ranks"][str(fired["rank"])]["stopped_by_launcher"] is False
    assert report["ranks"][str(fired["rank"])]["launch"] == report["launcher"]["ranks"][str(fired["rank"])]


def test_a_real_pipeline_in_mixed_forms_with_its_log_names_the_stage_a_signal_ended():
    """The SIGTERMed stage (rank 3) and two others left Flight Recorder's dumps; rank 2 the recorder's, blocked
    in its send to rank 3. Without the log: "one of ranks 0, 1, 3". The log says the launcher sent SIGTERM to
    ranks 0, 1, 2 only after rank 3 ended of a SIGTERM it did not send."""
    names = ["rank_0.fr.pkl", "rank_1.fr.json", "rank_2.jsonl", "rank_3.fr.pkl"]
    without = _given("gloo-pipeline-sigterm-log", names, 4)["findings"][0]
    assert without["ranks"] == [0, 1, 3] and without["detail"].startswith("one of"), without
    first = _given("gloo-pipeline-sigterm-log", names + ["torchrun.log"], 4)["findings"][0]
    assert first["ranks"] == [3] and "the launcher's log says rank 3 ended on its own" in first["detail"], first


def test_a_hang_stopped_from_outside_stays_undecided_with_its_log():
    """A pipeline stage hung; `distdoctor run` stopped the job (the agent got SIGTERM and stopped every rank).
    The log says every rank was stopped by the launcher: no rank ended on its own, and no claim is made."""
    assert truth("gloo-pipeline-hang-log")["kind"] == "hang"
    report = _given("gloo-pipeline-hang-log", _pickles(4) + ["torchrun.log"], 4)
    assert report["verdict"] == "undecided" and not report["findings"], report["findings"]
    assert report["launcher"]["told_to_stop"] is True
    assert {e["ended"] for e in report["launcher"]["ranks"].values()} <= {"stopped"}


TIMED_OUT = "RuntimeError: [pair.cc:598] Timed out waiting 1800000ms for recv operation to complete"


@CHECKS
@given(st.data())
def test_the_launchers_log_never_makes_a_verdict_less_right(data):
    """Any generated job with one fault, in any mix of forms, diagnosed without and with torchrun's log of how it
    ended: the rank that crashed raised before the launcher's signal; a rank that left no dump was killed or
    aborted itself; ranks blocked behind the fault may have timed out, or aborted themselves (Gloo's enforce
    failure on a collective mismatch another rank caused: SIGABRT) before the launcher's signal; the launcher
    stopped every other rank, the faulty one included where it was still running (a rank that skipped a call, or
    stopped in Python). Where the dumps alone named the faulty rank first, the log names it too; and the log
    never puts first a claim naming another rank alone that the dumps alone did not."""
    job = data.draw(jobs(max_faults=1).filter(lambda j: j.faults))
    faulty, (fault, _) = next(iter(job.faults.items()))
    ran = run(job)
    ts_in = traces(job, ran)
    assume(ts_in)
    blocked, _ = ground_truth(job, ran)
    forms = {r: data.draw(st.sampled_from(["native", "pickle", "json", "both"])) for r in range(job.world)}
    ends = {}
    for r in range(job.world):
        if r == faulty and ran[r][2] == "crash":
            ends[r] = (1, None, job.crash_text, False)
        elif r == faulty and fault == "no_dump":
            ends[r] = data.draw(st.sampled_from([(-9, "SIGKILL", None, False), (-6, "SIGABRT", None, False)]))
        elif r in blocked and r != faulty and data.draw(st.integers(0, 3)) == 0:
            ends[r] = data.draw(st.sampled_from([(1, None, TIMED_OUT, False), (-6, "SIGABRT", None, False)]))
        else:
            ends[r] = (-15, "SIGTERM", None, True)
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, forms)
        alone = analyze(load_traces([d], world_size=job.world))
        with open(os.path.join(d, "torchrun.log"), "w") as f:
            f.write(render_launch(ends, 4000))
        logged = analyze(load_traces([d], world_size=job.world))
    before = [(f.kind, f.ranks) for f in alone.findings]
    after = [(f.kind, f.ranks, f.detail[:200]) for f in logged.findings]
    event(f"{fault}: the dumps alone {'named it' if before and before[0][1] == [faulty] else 'did not'}")
    if alone.findings and alone.findings[0].ranks == [faulty]:
        assert logged.findings and logged.findings[0].ranks == [faulty], (fault, ends, before, after)
    if logged.findings and len(logged.findings[0].ranks) == 1 and logged.findings[0].ranks != [faulty]:
        assert before and before[0][1] == logged.findings[0].ranks, (fault, ends, before, after)  # no new claim


OWN = "RuntimeError: Split sizes doesn't match total dim 0 size"


@CHECKS
@given(jobs(faults=("size", "dtype"), max_faults=1).filter(lambda j: j.faults))
def test_a_crash_of_its_own_at_the_call_decides_a_mismatch_nothing_else_decides(job):
    """A rank passed another size or dtype, then raised at its next call, its own exception (an argument error,
    as torch's all_to_all_single raises on split sizes that do not add up). Where nothing else decides the
    mismatch (a group of two, an even split; a minority of several, a scatter's root), the rank whose own code
    raised there does (lead.py). (A real MoE run's Flight Recorder dumps with its torchrun log: the same.)"""
    faulty, (_, at) = next(iter(job.faults.items()))
    ran = run(job)
    ts_in = traces(job, ran)
    trace = ts_in.get(faulty)
    assume(trace is not None)
    line = 100 + at
    cut = next((i for i, e in enumerate(trace.entries) if e.frames and e.frames[-1].line == line), None)
    assume(cut is not None)
    text = OWN
    kind, _, message = text.partition(": ")
    raised = replace(trace.entries[cut], error=text, state="issued")  # the recorder marks the call that raised
    ts_in[faulty] = replace(trace, entries=[*trace.entries[:cut], raised], dump_reason=f"exception: {text}",
                            exception={"type": kind, "message": message, "thread": "MainThread", "exit_code": 1})
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, {})
        report = analyze(load_traces([d], world_size=job.world))
    got = [(f.kind, f.ranks, f.detail[:160]) for f in report.findings]
    assert report.findings, got
    assert report.findings[0].ranks == [faulty], got


GARBAGE = ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
           "you tried to allocate 4630685579355357184 bytes. Error code 12 (Cannot allocate memory)")


@CHECKS
@given(jobs(faults=("size", "dtype"), max_faults=1).filter(lambda j: j.faults))
def test_a_crash_after_the_call_by_a_rank_of_the_majority_does_not_outrank_the_mismatch(job):
    """A rank passed another size or dtype; a member that passed what two or more others passed completed the call
    and raised after it, an exception of its own code (the garbage size it received, then failed to allocate:
    70-335, object collectives, rank 0 retyped a broadcast). The members' values decide: the rank that differed
    leads, not the one that failed on what it received (lead.py, `_outvoted`)."""
    faulty, (_, at) = next(iter(job.faults.items()))
    step = job.steps[at]
    members = job.groups.get(step.group, [])
    assume(step.op != "p2p" and len(members) >= 4 and faulty in members)
    ran = run(job)
    ts_in = traces(job, ran)
    line = 100 + at
    healthy = [r for r in members if r != faulty and r in ts_in and any(
        e.frames and e.frames[-1].line == line and e.state == "completed" for e in ts_in[r].entries)]
    assume(healthy and faulty in ts_in)
    victim = healthy[0]
    trace = ts_in[victim]
    cut = next(i for i, e in enumerate(trace.entries) if e.frames and e.frames[-1].line == line)
    kind, _, message = GARBAGE.partition(": ")
    ts_in[victim] = replace(trace, entries=trace.entries[:cut + 1], dump_reason=f"exception: {GARBAGE}",
                            exception={"type": kind, "message": message, "thread": "MainThread", "exit_code": 1})
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, {})
        report = analyze(load_traces([d], world_size=job.world))
    got = [(f.kind, f.ranks, f.detail[:160]) for f in report.findings]
    assume(any(f.kind in ("size_mismatch", "dtype_mismatch") and f.ranks == [faulty] for f in report.findings))
    assert report.findings[0].ranks == [faulty], got


def test_a_real_retyped_broadcast_leads_the_garbage_size_a_peer_failed_to_allocate():
    """`gloo-objects-retype-garbage` (70-335): rank 0 retyped broadcast #3 of broadcast_object_list (float64
    against int64); rank 3 received its bytes as a size and failed to allocate 4.6e18 bytes. Ranks 0 and 3 left
    the recorder's trace, ranks 1 and 2 Flight Recorder dumps (pickle, JSON)."""
    fired = truth("gloo-objects-retype-garbage")
    assert (fired["kind"], fired["rank"]) == ("retype", 0)
    findings = _given("gloo-objects-retype-garbage", ["rank_0.jsonl", "rank_1.fr.pkl", "rank_2.fr.json",
                                                      "rank_3.jsonl"], 4)["findings"]
    assert [(f["kind"], f["ranks"]) for f in findings[:2]] == [("dtype_mismatch", [0]), ("crashed", [3])], findings


def test_a_real_moe_resize_from_flight_recorder_and_its_log_names_the_rank_that_raised():
    """MoE over Gloo, rank 3 resized its all_to_all_single input at call 21: the members' sizes do not add up,
    which alone cannot say whose ("one of ranks 0-3" from Flight Recorder's pickles). Its torchrun log shows
    rank 3 raising "Split sizes doesn't match total dim 0 size" right after that call, its own argument error:
    it leads, the mismatch after it (`gloo-moe-resize-log`)."""
    fired = truth("gloo-moe-resize-log")
    assert (fired["kind"], fired["rank"]) == ("resize", 3)
    alone = _given("gloo-moe-resize-log", _pickles(4), 4)["findings"][0]
    assert alone["kind"] == "size_mismatch" and alone["ranks"] == [0, 1, 2, 3], alone
    findings = _given("gloo-moe-resize-log", _pickles(4) + ["torchrun.log"], 4)["findings"]
    assert [(f["kind"], f["ranks"]) for f in findings[:2]] == [("crashed", [3]), ("size_mismatch", [0, 1, 2, 3])]


def test_the_text_report_says_in_one_line_how_the_log_says_each_rank_ended(tmp_path):
    for name in _pickles(4) + ["torchrun.log"]:
        (tmp_path / name).write_bytes((FIXTURES / "gloo-pipeline-exit-log" / name).read_bytes())
    proc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", str(tmp_path), "--world-size", "4"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines()[-1] == (f"the launcher's log ({tmp_path / 'torchrun.log'}): ranks 1, 3 raised; "
                                            "rank 2 exited with code 3; rank 0 stopped by the launcher."), proc.stdout
    assert "1. crashed: ranks [2]" in proc.stdout


def test_an_error_files_traceback_in_the_summary_is_no_exception_text():
    """With @record the summary's traceback field is the whole callstack over several lines: its first line is
    no exception. The rank reads `unshown` (exit code 1, its own lines hold no traceback), never a crash named
    'Traceback (most recent call last)'."""
    text = b"\n".join([b"torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", b"Root Cause "
                        b"(first observed failure):", b"[0]:", b"  time      : 2026-11-28_10:26:38",
                        b"  host      : node", b"  rank      : 2 (local_rank: 2)", b"  exitcode  : 1 (pid: 77)",
                        b"  error_file: /tmp/x/error.json", b"  traceback : Traceback (most recent call last):",
                        b'    File "train.py", line 3, in main', b"  ValueError: nope", b""])
    log = load_launcher_log(text, "torchrun.log")
    assert {r: (e.ended, e.exception) for r, e in log.ranks.items()} == {2: ("unshown", None)}


@pytest.mark.parametrize("stream,jobs", [(False, 1), (True, 1), (False, 2), (True, 2)])
def test_the_log_is_one_account_however_the_set_is_loaded(stream, jobs):
    """In this process or the loader's workers, whole or streaming: the log reaches the set as its account."""
    ts = load_traces([str(FIXTURES / "gloo-pipeline-exit-log")], world_size=4, jobs=jobs, stream=stream)
    assert ts.launch is not None and ts.errors == [], ts.errors
    assert {r: t.launch["ended"] for r, t in ts.ranks.items()} == {0: "stopped", 1: "exception", 2: "exit",
                                                                    3: "exception"}
