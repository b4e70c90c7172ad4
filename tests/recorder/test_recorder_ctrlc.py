"""A Ctrl-C to a hung job is a stop from outside, never the cause: every rank in Python raises KeyboardInterrupt
(the rank stuck in its data loader, and a rank polling its async all_reduce alike); the verdict still names the
rank that stopped, not the ranks the interrupt ended."""

from __future__ import annotations

import signal

import pytest

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import loads

pytestmark = pytest.mark.slow


def test_keyboard_interrupts_after_a_hang_do_not_outrank_the_rank_that_stopped(ranks_factory, tmp_path, wait_for):
    ranks = ranks_factory("ctrlc_job.py", 3)
    dumps = tmp_path / "dumps"

    def hung():
        try:
            return all((loads((dumps / f"rank_{r}.jsonl").read_text()).hang or {}).get("status") for r in (0, 2))
        except (OSError, ValueError):
            return False
    wait_for(hung, 120, "ranks 0 and 2 to dump the hang")
    for p in ranks.procs:
        p.send_signal(signal.SIGINT)
    codes = ranks.wait(120)
    assert codes[1] != 0 and codes[2] != 0, codes
    report = analyze(load_traces([str(dumps)]))
    traces = report.traces.ranks
    assert traces[1].exception["type"] == "KeyboardInterrupt" and traces[2].exception["type"] == "KeyboardInterrupt"
    first = report.findings[0]
    assert (first.kind, first.ranks) == ("missing_ranks", [1]), [(f.kind, f.ranks) for f in report.findings]
    assert not any(f.kind == "crashed" for f in report.findings), [(f.kind, f.ranks) for f in report.findings]
