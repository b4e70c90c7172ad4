"""Even votes in groups of two, from real gloo ranks' dumps: the evidence breaks the tie (what the sibling groups
issued at the same position; a call from a branch on the rank), and where nothing can, the finding names both
ranks and says so ("one of ranks 0, 1"), never a coin toss."""

from __future__ import annotations

import pytest

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces

from recorder_helpers import Ranks

pytestmark = pytest.mark.slow

SCENARIOS = {"siblings": 4, "conditional": 2, "blind": 2}  # scenario -> ranks


@pytest.fixture(scope="module")
def dump_dirs(tmp_path_factory) -> dict:
    """Every scenario's job started at once (each mostly waits out its gloo timeout) and waited for:
    {scenario: its dump directory}."""
    jobs = {}
    try:
        for scenario, n in SCENARIOS.items():
            dumps = tmp_path_factory.mktemp(scenario) / "dumps"
            jobs[scenario] = (Ranks("tie_job.py", n, dumps, args=(scenario,)), dumps)
        for r, _ in jobs.values():
            r.wait(150)
        return {scenario: dumps for scenario, (_, dumps) in jobs.items()}
    finally:
        for r, _ in jobs.values():
            r.kill()
            for log in r.logs:
                log.close()


def first_finding(dump_dirs, scenario: str):
    report = analyze(load_traces([str(dump_dirs[scenario])]))
    assert report.findings, scenario
    return report.findings[0]


def test_sibling_groups_say_which_member_of_two_is_odd(dump_dirs):
    """rank 0 gathers a shard for a log line while its TP peer is in the forward's all_reduce; the other TP
    group did the all_reduce at that position: rank 0 is odd (the lower rank used to win such a tie)."""
    f = first_finding(dump_dirs, "siblings")
    assert (f.kind, f.ranks, f.op, f.seq) == ("type_mismatch", [0], "all_gather", 3), f.detail
    assert "sibling groups issued what rank 1 issued" in f.detail
    assert f.evidence["tie"]["decided_by"] == "sibling groups"


def test_a_call_from_a_branch_on_the_rank_is_the_odd_one(dump_dirs):
    f = first_finding(dump_dirs, "conditional")
    assert (f.kind, f.ranks) == ("type_mismatch", [0]), f.detail
    assert "rank 0's call comes from a branch on the rank (tie_job.py:" in f.detail and "if rank == 0:" in f.detail


def test_where_nothing_tells_both_are_named_and_it_is_said(dump_dirs):
    f = first_finding(dump_dirs, "blind")
    assert (f.kind, f.ranks) == ("root_mismatch", [0, 1]), f.detail
    assert f.detail.startswith("one of ranks 0, 1: ") and f.evidence["tie"]["undecided"] is True
