"""A rank a signal ended first is the culprit. Real dumps kept by the job fuzzer (fuzz/run_jobs.py, seed 11, run
42: the DCP program, `--inject kill:1:SIGTERM@step=4`; injected.json is its truth): rank 1's dump says `signal:
SIGTERM`; 0.1 s later ranks 0 and 2 died of "Connection reset by peer" inside DDP's gradient all_reduce (issued
from C++, so no recorded call holds them). Before, nothing explained their crashes but themselves: `crashed [0, 2]`,
and `run`'s closing line named them."""

from __future__ import annotations

import json
from pathlib import Path

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces

DUMPS = Path(__file__).parent / "data" / "dcp_sigterm"


def test_the_rank_a_signal_ended_before_the_others_failed_is_first():
    truth = json.loads((DUMPS / "injected.json").read_text())
    assert [f["fault"] for f in truth["fired"]] == ["kill:1:SIGTERM@step=4"]
    report = analyze(load_traces([str(DUMPS / f"rank_{r}.jsonl") for r in range(4)]))
    first = report.findings[0]
    assert (first.kind, first.ranks) == ("crashed", [1]), [(f.kind, f.ranks) for f in report.findings]
    assert first.evidence["signal"] == "SIGTERM" and first.evidence["then_failed"] == [0, 2]
    assert not any(f.kind == "crashed" and set(f.ranks) & {0, 2} for f in report.findings)
    both = analyze(load_traces([str(DUMPS)]))  # with Flight Recorder's pickles beside: the same first finding
    assert (both.findings[0].kind, both.findings[0].ranks) == ("crashed", [1])
