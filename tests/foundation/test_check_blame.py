"""`check` names the rank that caused a failure as `validate` does, before the ranks that only timed out waiting
for it: a rank that skipped a call is the cause, the others' timeouts its consequence."""

from __future__ import annotations

import json

import pytest
from world_helpers import distdoctor


@pytest.mark.parametrize("fault", ["skip:1", "skip:2:3"])
def test_check_names_the_rank_that_skipped_a_call(fault):
    rank = int(fault.split(":")[1])
    out = distdoctor("check", "--inject", fault, "--nproc", "4", "--timeout", "10", "--format", "json", timeout=300)
    assert out.returncode == 1, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["validate"]["culprit_ranks"] == [rank]
    verdict = doc["verdict"]
    assert verdict.startswith(f"FAIL on 4 ranks, gloo on CPU, iface lo: rank {rank}: skipped #"), verdict
    others = ", ".join(str(r) for r in range(4) if r != rank)
    assert f"then ranks {others} timed out or failed waiting for it" in verdict, verdict
    assert out.leftover == []


def test_a_crashed_rank_is_never_taken_for_a_consequence():
    """Beside a straggler validate blames, a rank that crashed on its own is still named lost with its cause; only
    ranks that just timed out are consequences."""
    from distdoctor.report.check_text import verdict

    report = {"world_size": 4, "backend": "gloo", "device": "cpu", "iface": "lo", "passed": False,
              "bench": {"rows": [], "failures": []},
              "validate": {"results": [], "culprits": [{"rank": 0, "why": ["straggler: arrives 300 ms late"]}]},
              "lost": [{"rank": 1, "reason": "exited with code 17", "in_op": "#1 all_reduce"},
                       {"rank": 2, "reason": "timed out waiting for peers: RuntimeError: ...", "in_op": None}]}
    assert verdict(report) == ("FAIL on 4 ranks, gloo on CPU, iface lo: rank 0: straggler: arrives 300 ms late; "
                               "rank 1 lost (exited with code 17, in #1 all_reduce); then rank 2 timed out or failed "
                               "waiting for them")
