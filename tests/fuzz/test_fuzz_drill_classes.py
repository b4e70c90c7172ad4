"""The real runs behind this stop's classes, found by the drills the fuzzer did not sample before (twice, crash,
hang:gil, slow, reroot, repeer, and call faults on a pipeline's own sends and receives), each read as the fuzzer
reads it; the generated families beside them (test_fuzz_p2p_deviation.py, test_fuzz_held_stragglers.py,
test_fuzz_stopped_fr_rank.py, test_fuzz_p2p_stragglers.py) test each class whole. Beside them, the stored runs of
later campaigns behind later classes (their families: test_fuzz_held_stragglers.py, test_fuzz_parted_frontier.py,
test_fuzz_next_call.py, test_fuzz_lost_peers.py, test_fuzz_object_bytes.py, test_fuzz_sibling_mismatch.py), the
hedged ones among them asserted as hedges that hold the drilled rank."""

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
    # seed 74's campaign: false claims in most modes before their rules (docs/diagnose.md, "This stop: a lone
    # caller, ...")
    ("gloo-dcp8-slow", "rank_*.fr.pkl", 8, "straggler"),  # held stragglers: DCP's gathers' root was named
    ("gloo-ddp8-skip-passed", "rank_*.fr.pkl", 8, "size_mismatch"),  # a skipper the others went past
    ("gloo-hsdp8-twice", "rank_*.jsonl", 8, "type_mismatch"),  # an extra call on a mesh dimension
    ("gloo-hsdp-twice", "rank_*.fr.pkl", 4, "type_mismatch"),  # the same, 4 ranks, Flight Recorder's dumps
    # seed 75: a part of an object collective skipped, the skipper dead of the buffer it never filled
    ("gloo-objects-skip-sizes-died", "rank_*.jsonl", 4, "crashed"),  # broadcast_object_list's sizes
    ("gloo-objects-skip-bytes", "rank_*.jsonl", 4, "crashed"),  # all_gather_object's pickles
    ("gloo-hsdp-slow", "rank_*.fr.pkl", 4, "straggler"),  # its shard peer, held, passed for its role: unnamed
    ("gloo-pipeline8-skip-early", "rank_*.jsonl", 8, "p2p_deadlock"),  # read against its role (p2p_roles.py)
    # seeds 72-75: a pipeline's end stage, or a middle stage with no other of its role, named with its peer as
    # one cycle `[2, 3]`; what each stage was fed and passed on says which (p2p_flows.py)
    ("gloo-pipeline-last-twice", "rank_*.jsonl", 4, "p2p_deadlock"),  # waits for an activation nobody owes it
    ("gloo-pipeline-last-skip-recv", "rank_*.jsonl", 4, "p2p_deadlock"),  # sends a gradient nothing fed
    ("gloo-pipeline-last-skip-send", "rank_*.jsonl", 4, "p2p_deadlock"),  # went on owing one
    ("gloo-pipeline-repeer-mid", "rank_*.jsonl", 4, "p2p_deadlock"),  # asked the wrong peer, fed ones waiting
]

HEDGES = [
    # fixture, the files read, world size, the first finding's kind, the ranks it must hold among its suspects:
    # the evidence cannot decide, and says so ("one of ..."), never naming the victim alone
    ("gloo-fsdp-twice-lost", "rank_*.jsonl", 4, "missing_dump", {1, 2}),  # a lone caller beside a lost peer
    ("gloo-objects8-reroot-mixed", "rank_*", 8, "crashed", {1, 3, 5, 7}),  # died unpacking a rerooted broadcast
    ("gloo-tp-resize-first-lost", "rank_*.jsonl", 4, "size_mismatch", {0, 2}),  # a group's first call resized,
    ("gloo-tp-resize-first-lost", "rank_*.fr.pkl", 4, "size_mismatch", {0, 2}),  # its one peer aborted: nothing
    ("gloo-tp-resize-first-lost", "json/rank_*.fr.json", 4, "size_mismatch", {0, 2}),  # vouches for the groups
    # seed 75: a stage died unpickling a recv's bytes, Flight Recorder's dumps blind to p2p, the launcher's log
    # giving the exceptions: its neighbours' closed connections were named `crashed [0, 2]`
    ("gloo-pipeline8-unpacked-log", ("rank_*.fr.pkl", "torchrun.log"), 8, "crashed", {1}),
]


@pytest.mark.parametrize("fixture, pattern, world, kind", CASES, ids=[c[0] for c in CASES])
def test_the_drilled_rank_is_named_first(fixture, pattern, world, kind):
    fired = truth(fixture)
    _, report = diagnose_form(fixture, pattern, world)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == (kind, [fired["rank"]]), report["findings"]


@pytest.mark.parametrize("fixture, pattern, world, kind, among", HEDGES,
                         ids=[f"{c[0]}-{(c[1] if isinstance(c[1], str) else c[1][0]).split('.')[-1]}" for c in HEDGES])
def test_where_the_evidence_cannot_decide_the_drilled_rank_is_among_the_named(fixture, pattern, world, kind,
                                                                              among):
    fired = truth(fixture)
    _, report = diagnose_form(fixture, pattern, world)
    first = report["findings"][0]
    suspects = first["evidence"].get("suspects") or first["ranks"]
    assert first["kind"] == kind and first["evidence"].get("undecided"), report["findings"]
    assert fired["rank"] in suspects and among <= set(suspects), (suspects, first["detail"])
    assert first["detail"].startswith("one of ranks"), first["detail"]
