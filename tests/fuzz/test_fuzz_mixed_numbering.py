"""Real jobs whose ranks left different forms of trace, one each: the recorder's `rank_<r>.jsonl` (it counts the
Python calls it saw), Flight Recorder's pickle or JSON (it numbers every collective of the process group, also
those issued from C++: DDP's buckets and initial broadcast, DTensor's functional collectives, DCP's internals).
No rank left both, so nothing aligns a rank with itself: the recorder-only ranks are placed among the Flight
Recorder ranks' calls (trace/loaders/align_ranks.py), and the calls they cannot see are neither present nor
absent for them. Before, position k of one numbering was compared with position k of the other: false
type_mismatch / missing_ranks on healthy jobs, and the wrong rank blamed on injected ones.

The fixtures (tests/fixtures/gloo-mixed-*) are fuzz/jobs.py programs run under `distdoctor run` over gloo, each
rank's file the form the real-job fuzzer's mixed mode gave diagnose; `.injected.json` holds what fired.
"""

from __future__ import annotations

import pytest

from real_dumps import FIXTURES, diagnose_form, truth

HEALTHY = {"gloo-mixed-ddp-healthy": 8, "gloo-mixed-tp-healthy": 4, "gloo-mixed-dcp-healthy": 4}


@pytest.mark.parametrize("fixture", sorted(HEALTHY))
def test_a_healthy_job_has_no_finding_whatever_forms_its_ranks_left(fixture):
    assert not (FIXTURES / fixture / ".injected.json").exists()
    rc, doc = diagnose_form(fixture, "rank_*", HEALTHY[fixture])
    assert (rc, doc["verdict"], doc["findings"]) == (0, "ok", []), doc["findings"][:1]
    placed = [r for r, p in doc["ranks"].items() if "placed_among_flight_recorder" in p.get("merged", {})]
    assert placed, "the recorder-only ranks were placed among the Flight Recorder ranks' calls"


def _first(fixture: str, world: int) -> dict:
    rc, doc = diagnose_form(fixture, "rank_*", world)
    assert rc == 1 and doc["verdict"] == "problem"
    return doc["findings"][0]


def test_a_rank_that_raised_and_left_the_recorders_trace_is_the_crashed_one():
    fired = truth("gloo-mixed-ddp-raise")
    assert (fired["kind"], fired["rank"]) == ("raise", 1)
    assert (FIXTURES / "gloo-mixed-ddp-raise" / "rank_1.jsonl").exists()  # its exception is in its trace
    first = _first("gloo-mixed-ddp-raise", 4)
    assert (first["kind"], first["ranks"]) == ("crashed", [1]), first


def test_a_rank_that_raised_and_left_flight_recorders_dump_is_the_one_the_others_wait_for():
    fired = truth("gloo-mixed-ddp-raise-fr")
    assert (fired["kind"], fired["rank"]) == ("raise", 0)
    assert (FIXTURES / "gloo-mixed-ddp-raise-fr" / "rank_0.fr.json").exists()  # Flight Recorder keeps no exception
    first = _first("gloo-mixed-ddp-raise-fr", 4)
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [0]), first


def test_a_killed_rank_that_left_no_dump_is_named_not_a_recorder_only_peer():
    fired = truth("gloo-mixed-dcp-sigkill")
    assert (fired["kind"], fired["rank"]) == ("kill", 0)
    first = _first("gloo-mixed-dcp-sigkill", 4)
    assert (first["kind"], first["ranks"]) == ("missing_dump", [0]), first
