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
