"""The real runs behind this stop's classes, found by the drills the fuzzer did not sample before (twice, crash,
hang:gil, slow, reroot, repeer, and call faults on a pipeline's own sends and receives), each read as the fuzzer
reads it; the generated families beside them (test_fuzz_p2p_deviation.py, test_fuzz_held_stragglers.py,
test_fuzz_stopped_fr_rank.py, test_fuzz_p2p_stragglers.py) test each class whole."""

from __future__ import annotations

import pytest

from real_dumps import diagnose_form, truth

CASES = [
    # fixture, the files read, world size, the first finding (kind, ranks)
    ("gloo-pipeline-retype-lost", "rank_*.jsonl", 4, "dtype_mismatch"),  # the receiver Gloo aborted was named
    ("gloo-pipeline-resize-batch-lost", "rank_*.jsonl", 4, "size_mismatch"),  # sends posted after it stay open
    ("gloo-pipeline-resize-recv", "rank_*.jsonl", 4, "size_mismatch"),  # "one of ranks 0, 1"
    ("gloo-dcp-slow", "rank_*.fr.pkl", 4, "straggler"),  # the gathers' root, held waiting, was named
    ("gloo-tp-slow-fr", "rank_*.fr.pkl", 4, "straggler"),  # a held sibling passed for a role: nothing named
    ("gloo-hsdp-skip-mixed", "rank_*", 4, "type_mismatch"),  # a call the recorder's rank had not reached yet
    ("gloo-pipeline-crash-early", "rank_*.jsonl", 4, "missing_dump"),  # the schedule's shape exchange, no odd one
]


@pytest.mark.parametrize("fixture, pattern, world, kind", CASES, ids=[c[0] for c in CASES])
def test_the_drilled_rank_is_named_first(fixture, pattern, world, kind):
    fired = truth(fixture)
    _, report = diagnose_form(fixture, pattern, world)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == (kind, [fired["rank"]]), report["findings"]
