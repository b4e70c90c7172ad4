"""Recorder traces of a job whose collectives are issued from C++ (DDP, DCP), where one rank raised: the hang
headers name the survivors' calls by Flight Recorder's numbering, the recorder's entries count only the Python
calls. A real DCP run (rank 1 raised at a step) read `order_deadlock [0, 2, 3]` first from its recorder traces: a
rank blocked in #7 was taken to wait for one already in #8 (past #7), and back. The rank that raised comes first,
and no cycle is made of two numberings or of the victims of its exception. Over generated jobs (trace_sets.py)."""

from __future__ import annotations

import tempfile

from hypothesis import given

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import dumps
from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import crash_under_hidden_calls, cycle_among_victims


def _diagnose(traces):
    with tempfile.TemporaryDirectory() as d:
        for r, t in traces.items():
            with open(f"{d}/rank_{r}.jsonl", "w") as f:
                f.write(dumps(t))
        ts = load_traces([d])
    assert ts.errors == [], ts.errors
    return analyze(ts)


def _crash_first(case):
    """The report, once its first finding is the crash of the rank that raised and no finding is a cycle."""
    traces, culprit = case
    report = _diagnose(traces)
    got = [(f.kind, f.ranks) for f in report.findings]
    assert got[0] == ("crashed", [culprit]) and not any(k == "order_deadlock" for k, _ in got), got
    return report


@CHECKS
@given(crash_under_hidden_calls())
def test_the_rank_that_raised_comes_first_and_no_cycle_is_made_of_its_victims(case):
    traces = case[0]
    report = _crash_first(case)
    for w in report.waits:  # a rank in a later call of the group (by the same numbering) has passed this one
        ahead = [b for b in w.waits_for if (traces[b].hang or {}).get("this_rank", {}).get("blocked_in", {})
                 .get("seq", 0) > w.entry.seq]
        assert not ahead, (w.rank, w.entry.seq, w.waits_for)


@CHECKS
@given(cycle_among_victims())
def test_a_cycle_whose_every_wait_also_waits_for_the_rank_that_raised_does_not_outrank_it(case):
    report = _crash_first(case)
    cycle = [c for c in report.consequences if c["kind"] == "order_deadlock"]
    assert cycle and cycle[0]["finding"] == 0, report.consequences


def test_the_real_dcp_run_names_the_rank_that_raised_from_the_recorders_traces():
    """The run itself: DCP, 4 ranks, rank 1 raised at a step (`tests/fixtures/gloo-dcp-raise`)."""
    fired = truth("gloo-dcp-raise")
    _, report = diagnose_form("gloo-dcp-raise", "rank_*.jsonl", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("crashed", [fired["rank"]]), report["findings"]
    assert not any(f["kind"] == "order_deadlock" for f in report["findings"])
