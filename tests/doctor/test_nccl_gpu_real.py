"""A one-rank NCCL job on a real GPU (an H200, NCCL 2.28.9, torch 2.11) whose GPU stopped: a kernel that spins for
minutes was queued ahead of an all_reduce (scripts/gpu/stall_job.py, run under `distdoctor run` by
scripts/gpu/check.sh; docs/gpu.md). The dumps it left, with collective timing off and on, are read here: the
recorder's trace in NCCL's terms (its pg_status; a call that returned is not a call the GPU completed), Flight
Recorder's pickle and JSON, each alone and together."""

import json
import os
import shutil

import pytest

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.frontier import frontiers, is_async
from distdoctor.trace.loaders import load_traces

HERE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "real-nccl-gpu")
SETS = ["stall-timing-off", "stall-timing-on"]


def _only(tmp_path, src: str, *names: str) -> str:
    os.makedirs(tmp_path / "d")
    for n in names:
        shutil.copy(os.path.join(src, n), tmp_path / "d" / os.path.basename(n))
    return str(tmp_path / "d")


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("form", [["rank_0.jsonl", "rank_0.fr.pkl"], ["rank_0.jsonl", ".fr-json/rank_0.fr.json"],
                                  ["rank_0.jsonl"]])
def test_the_stopped_gpu_is_named_from_the_recorders_dumps(tmp_path, name, form):
    ts = load_traces([_only(tmp_path, os.path.join(HERE, name), *form)], world_size=1)
    report = analyze(ts)
    first = report.findings[0]
    assert (first.kind, first.ranks, first.group, first.seq, first.op) == ("gpu_stopped", [0], "0", 6, "all_reduce")
    assert "enqueued up to #7, completed up to #5" in first.detail and "only member" in first.detail
    assert not first.evidence.get("undecided")
    assert report.verdict == "problem"


@pytest.mark.parametrize("name", SETS)
def test_the_recorders_trace_says_what_the_gpu_completed(name):
    """The Python call of all_reduce #6 and #7 returned (NCCL enqueues); the recorder's trace still says the GPU
    never completed them, and carries the group's frontier."""
    ts = load_traces([os.path.join(HERE, name, "rank_0.jsonl")], world_size=1)
    t = ts.ranks[0]
    assert is_async(t)
    states = {e.seq: e.state for e in t.entries if e.group == "0" and e.seq is not None}
    assert states[5] == "completed" and states[6] != "completed" and states[7] != "completed"
    f = frontiers(t)["0"]
    assert (f.enqueued, f.completed, f.source) == (7, 5, "pg_status")
    assert f.started == (5 if name.endswith("on") else None)  # -1 with timing off: unknown


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("form", ["rank_0.fr.pkl", ".fr-json/rank_0.fr.json"])
def test_flight_recorder_alone_says_in_flight_not_ok(tmp_path, name, form):
    """Flight Recorder's dump alone holds no hang episode: the collectives every member reached are running on the
    GPU, which is what it says (never `ok`), with the frontier read from its pg_status."""
    ts = load_traces([_only(tmp_path, os.path.join(HERE, name), form)], world_size=1)
    t = ts.ranks[0]
    assert t.comm_lib_version == "2.28.9" and t.pg_status["0"][0] == 7 and t.pg_status["0"][2] == 5
    report = analyze(ts)
    assert report.findings == [] and report.verdict == "in_flight" and report.in_flight_ranks() == [0]


def test_the_hang_header_holds_where_the_gpu_stood():
    with open(os.path.join(HERE, "stall-timing-on", "rank_0.jsonl")) as f:
        header = json.loads(f.readline())
    gpu = header["hang"]["this_rank"]["blocked_in"]["gpu"]
    assert gpu == {"state": "scheduled", "ran_ahead": {"0": [7, 5, 5]}}
    assert header["pg_status"] == {"0": [7, 5, 5]} and header["pg_names"] == {"0": "0"}


@pytest.mark.parametrize("form", [["rank_0.jsonl", "rank_0.fr.pkl"], ["rank_0.jsonl"]])
def test_a_cpu_that_stopped_is_told_from_a_gpu_that_stopped(tmp_path, form):
    """The same job whose CPU stopped outside collectives (MODE=cpu): its GPU completed everything it was given,
    nothing is in flight, and the recorder confirmed the hang after its timeout: cpu_stopped, not gpu_stopped."""
    ts = load_traces([_only(tmp_path, os.path.join(HERE, "cpu-stop"), *form)], world_size=1)
    report = analyze(ts)
    assert [(f.kind, f.ranks) for f in report.findings] == [("cpu_stopped", [0])]
    assert "GPU completed all it enqueued (rank 0: group 0 up to #5)" in report.findings[0].detail


def test_a_healthy_moment_of_the_same_job_is_not_a_stopped_cpu(tmp_path):
    """Without the recorder's confirmed hang the same caught-up frontier is a job between collectives."""
    ts = load_traces([_only(tmp_path, os.path.join(HERE, "cpu-stop"), "rank_0.fr.pkl")], world_size=1)
    report = analyze(ts)
    assert report.findings == [] and report.verdict == "ok"
