"""The hangs issue 11 saw reported OK, as small hand-made trace sets (their real reproductions are scenarios in
tests/doctor/scenarios/jobs.py; the property over generated sets is tests/fuzz/test_fuzz_invariant.py)."""

import json

from distdoctor.diagnose import analyze
from distdoctor.report.diagnose_text import render_text
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import Frame, GroupInfo, TraceSet
from test_doctor_analyzer import coll, found, load, p2p, trace
from test_doctor_vocabulary import EMPTY_FR_JSON, fr_entry

WORLD = [0, 1, 2, 3]


def accounted(report) -> set[int]:
    """Every rank a finding names or a consequence lists (with a finding that exists)."""
    doc = report.to_json()
    for c in doc["consequences"]:
        f = doc["findings"][c["finding"]]
        assert c["finding_ref"] == {"kind": f["kind"], "group": f["group"], "seq": f["seq"]}
    return {r for f in doc["findings"] for r in f["ranks"]} | {r for c in doc["consequences"] for r in c["ranks"]}


def blocked(report) -> set[int]:
    return {int(r) for r, p in report.ranks.items() if p.get("pending")}


def test_ranks_that_moved_on_while_others_are_still_inside(tmp_path):
    """Ranks 0, 1 completed all_reduce #2 and wait in #3; ranks 2, 3 are still inside #2. Before, #3 showed 2 and
    3 'absent' and their absence was a consequence of... nothing: verdict OK."""
    traces = []
    for r in WORLD:
        es = [coll(0, 1), coll(1, 2, state="completed" if r < 2 else "started")]
        if r < 2:
            es.append(coll(2, 3, state="started"))
        traces.append(trace(r, es))
    report = load(tmp_path, traces)
    assert found(report)[0] == ("state_mismatch", [2, 3], "0", 2, "all_reduce")
    assert "The others went on to all_reduce #3, which ranks 2, 3 never reached" in report.findings[0].detail
    assert blocked(report) <= accounted(report)
    assert {(c["kind"], tuple(c["ranks"]), c["finding"]) for c in report.consequences} == {("blocked", (0, 1), 0)}


def test_a_finished_call_gloo_had_not_marked_completed(tmp_path):
    """Rank 3 returned from all_reduce #2 and stopped in its data loader; its dump (taken a moment after) still
    shows #2 in flight. It is the rank the others wait for in #3, not a rank 'blocked elsewhere'."""
    traces = [trace(r, [coll(0, 1), coll(1, 2, state="completed" if r < 3 else "started")]
                    + ([coll(2, 3, state="started")] if r < 3 else []),
                    stacks={"MainThread": [Frame("load_batch", "data.py", 7)]} if r == 3 else None) for r in WORLD]
    report = load(tmp_path, traces)
    assert found(report) == [("missing_ranks", [3], "0", 3, "all_reduce")]
    assert "still shows all_reduce #2 on group '0' in flight, which every other member completed" in \
        report.findings[0].detail
    assert report.ranks["3"]["state"] == "outside_collectives" and report.ranks["3"]["pending"] == []


def test_a_rank_alone_on_a_group_no_other_member_used(tmp_path):
    """A metrics group made with new_group: only rank 2 reduces on it. Gloo's dumps list no members, so the
    group looks like rank 2's alone, and rank 2 waited for nobody: verdict OK before."""
    for r in WORLD:
        entries = [fr_entry(0, 1), fr_entry(1, 2)]
        if r == 2:
            e = fr_entry(2, 1, retired=False)
            e["process_group"] = ["5", "metrics"]
            entries.append(e)
        else:
            entries.append(fr_entry(2, 3, retired=False))
        (tmp_path / f"fr_rank_{r}.json").write_text(json.dumps({"version": "2.10", "pg_config": {}, "entries": entries}))
    report = analyze(load_traces([str(tmp_path)]))
    assert found(report) == [("missing_ranks", [2], "0", 3, "all_reduce")]
    d = report.findings[0].detail
    assert "it is blocked in all_reduce #1 on group '5'" in d and "no other rank's trace shows group '5'" in d
    assert report.to_json()["groups"]["5"] == {"members": [2], "inferred": True, "desc": "metrics"}
    assert report.ranks["2"]["state"] == "stuck_in_collective" and blocked(report) <= accounted(report)


def test_broadcast_object_list_with_a_root_that_differs(tmp_path):
    """broadcast_object_list is two broadcasts (sizes, then bytes); rank 3's config says src=3."""
    traces = []
    for r in WORLD:
        root = 3 if r == 3 else 0
        es = [coll(0, 1), coll(1, 2, op="broadcast", root=root, dtype="int64", state="completed" if r in (0, 2)
                                else "started")]
        if r in (0, 2):
            es.append(coll(2, 3, op="broadcast", root=root, dtype="uint8", state="started"))
        traces.append(trace(r, es))
    report = load(tmp_path, traces)
    assert found(report)[0] == ("root_mismatch", [3], "0", 2, "broadcast")
    assert blocked(report) <= accounted(report) and report.verdict == "problem"


def test_consequences_are_never_of_nothing(tmp_path):
    """The text report speaks of consequences only under findings, and each names its finding."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    ok = load(tmp_path / "a", [trace(r, [coll(0, 1)]) for r in WORLD])
    assert ok.verdict == "ok" and "consequences" not in render_text(ok)
    traces = [trace(r, [coll(0, 1), *([coll(1, 2, state="started")] if r != 1 else [])]) for r in WORLD]
    text = render_text(load(tmp_path / "b", traces))
    assert "consequences of the findings above (1" in text
    assert "ranks 0, 2, 3: blocked in all_reduce #2 on the default group '0', waiting for rank 1 (finding 1)" in text


def test_a_send_its_peer_received_does_not_hide_the_recv_the_rank_is_in(tmp_path):
    """Rank 0's isend to rank 1 is not marked completed (its Work was never waited on), but rank 1 received it;
    rank 0 now sits in a recv from rank 1, which rank 1 (stuck in Python) never sends. Before, rank 0 was shown
    'blocked in send', which waited for nobody."""
    r0 = trace(0, [p2p(0, "send", 1, 1, state="started"), p2p(1, "recv", 1, 1, state="started")], world=2)
    r1 = trace(1, [p2p(0, "recv", 0, 1, state="completed")], world=2,
               stacks={"MainThread": [Frame("compute", "model.py", 9)]})
    report = load(tmp_path, [r0, r1])
    assert found(report) == [("missing_ranks", [1], "0", 1, "recv")]
    assert report.ranks["0"]["pending"][0]["op"] == "recv"
    assert "rank 0 waits in recv #1 from rank 1" in report.findings[0].detail


def test_pipeline_stages_that_disagree_on_the_number_of_micro_batches(tmp_path):
    """Stage 0 sends 3 activations, stage 1 takes 2 and goes on to the end-of-step all_reduce."""
    groups = {"0": [0, 1], "pp": [0, 1]}
    r0 = trace(0, [p2p(0, "send", 1, 1, "completed", "pp"), p2p(1, "send", 1, 2, "completed", "pp"),
                   p2p(2, "send", 1, 3, "started", "pp")], groups=groups, world=2)
    r1 = trace(1, [p2p(0, "recv", 0, 1, "completed", "pp"), p2p(1, "recv", 0, 2, "completed", "pp"),
                   coll(2, 1, state="started")], groups=groups, world=2)
    report = load(tmp_path, [r0, r1])
    # rank 1 deviates (it stopped short and went on): it is named first, and the evidence says so
    assert found(report) == [("p2p_deadlock", [1, 0], "pp", 3, "send")]
    assert report.findings[0].evidence["deviating"] == 1
    assert "1. p2p_deadlock: ranks [1, 0] at send #3 on group 'pp'" in render_text(report)
    assert json.loads(json.dumps(report.to_json()))["findings"][0]["ranks"] == [1, 0]
    assert "rank 1 posted only 2 matching recvs and went on to all_reduce #1" in report.findings[0].detail


def test_a_crash_is_a_crash(tmp_path):
    exc = [Frame("<module>", "train.py", 80), Frame("forward", "model.py", 41)]
    traces = [trace(r, [coll(0, 1)] + ([coll(1, 2, state="started")] if r != 2 else [])) for r in WORLD]
    traces[2].dump_reason = "exception: ValueError: bad shape"
    traces[2].stacks = {"exception in MainThread": exc, "MainThread (7)": exc}
    report = load(tmp_path, traces)
    f = report.findings[0]
    assert (f.kind, f.ranks, f.group, f.seq) == ("crashed", [2], "0", 2)
    assert f.detail.startswith("rank 2 crashed: ValueError: bad shape, raised at forward (model.py:41)")
    line = render_text(report).split("where each rank is:")[1].splitlines()[3]
    assert line.startswith("  rank 2:") and "crashed: ValueError: bad shape" in line and "in no collective" not in line


def test_a_rank_that_recorded_nothing_is_not_a_lost_rank(tmp_path):
    """Rank 1's Flight Recorder JSON dump holds no `entries` key (it recorded nothing); rank 0 waits for it."""
    (tmp_path / "fr_rank_0.json").write_text(json.dumps({"version": "2.10", "pg_config": {}, "entries": [
        fr_entry(0, 1, retired=False)]}))
    (tmp_path / "fr_rank_1.json").write_bytes(EMPTY_FR_JSON)
    report = analyze(load_traces([str(tmp_path)]))
    assert found(report) == [("missing_ranks", [1], "0", 1, "all_reduce")]
    assert report.ranks["1"]["state"] == "never_joined"


def test_the_wave_of_waiting_starts_where_the_idle_rank_is():
    """Tensor groups inside pipeline groups inside data parallel: rank 5 stops in Python. Its tensor peer waits
    for it, the data-parallel peers wait for the tensor peer, and so on: one finding (rank 5), every other wait
    a consequence pointing at it, with the group each waits in."""
    world = 8
    groups = {"0": list(range(world)), "tp2": [4, 5], "dp1": [1, 5], "tp0": [0, 1], "dp0": [0, 4]}
    ts = TraceSet(world_size=world)
    for r in range(world):
        mine = {g: m for g, m in groups.items() if r in m}
        es = [coll(0, 1)]
        if r == 4:
            es.append(coll(1, 1, group="tp2", state="started", t=2.0))
        elif r == 1:
            es.append(coll(1, 1, group="dp1", state="started", t=2.1))
        elif r == 0:
            es.append(coll(1, 1, group="dp0", state="started", t=2.2))
        elif r != 5:
            es.append(coll(1, 2, state="started", t=2.3))
        ts.ranks[r] = trace(r, es, groups=mine, world=world)
        ts.ranks[r].groups = {g: GroupInfo(g, m) for g, m in mine.items()}
    report = analyze(ts)
    assert [(f.kind, f.ranks) for f in report.findings][:1] == [("missing_ranks", [5])]
    waits = {(c["group"], tuple(c["ranks"])) for c in report.consequences if c["kind"] == "blocked"}
    assert ("dp0", (0,)) in waits and all(c["finding"] == 0 for c in report.consequences)
    assert blocked(report) <= accounted(report)


def test_groups_are_named_as_the_user_named_them(tmp_path):
    """DeviceMesh dimensions and group_desc reach the report beside the group's id, in text and JSON."""
    groups = {"0": WORLD, "3": [0, 1], "4": [2, 3]}
    traces = [trace(r, [coll(0, 1, group="3" if r < 2 else "4"),
                        coll(1, 2, group="3" if r < 2 else "4", state="completed" if r != 1 else "started")]
                    + ([] if r == 0 else [coll(2, 3, group="3" if r < 2 else "4", state="started")]),
                    groups=groups) for r in WORLD]
    for t in traces:
        t.groups["3"].desc, t.groups["4"].desc = "mesh_dp", "mesh_dp"
    report = load(tmp_path, traces)
    assert report.to_json()["groups"]["3"]["desc"] == "mesh_dp"
    assert "group '3' (mesh_dp)" in report.findings[0].detail


def test_a_wait_for_a_rank_blocked_after_a_divergence_is_its_consequence(tmp_path):
    """Rank 0 waits in group 'h' for rank 1, which sits in G#2 after G parted ways at G#1 (rank 4 passed
    another dtype): rank 0's wait is a consequence of that mismatch, found through rank 1."""
    groups = {"0": list(range(5)), "g": [1, 2, 3, 4], "h": [0, 1]}
    traces = []
    for r in range(5):
        mine = {n: m for n, m in groups.items() if r in m}
        if r == 0:
            es = [coll(0, 1, group="h", state="started")]
        else:
            es = [coll(0, 1, group="g", dtype="int64" if r == 4 else "float32"), coll(1, 2, group="g", state="started")]
        traces.append(trace(r, es, groups=mine, world=5))
    report = load(tmp_path, traces)
    assert found(report)[0] == ("dtype_mismatch", [4], "g", 1, "all_reduce")
    assert blocked(report) <= accounted(report)
    c = next(c for c in report.consequences if c["ranks"] == [0])
    assert c["finding"] == 0 and c["because"] == "waiting for rank 1"


def test_stages_that_both_receive_after_disagreeing_on_micro_batches(tmp_path):
    """GPipe, stage 1 configured for 3 micro-batches, stage 0 for 2: stage 1 waits for a 3rd activation while
    stage 0 waits for its 1st gradient. Both receive: a p2p deadlock, and the count says why."""
    groups = {"0": [0, 1], "pp": [0, 1]}
    r0 = trace(0, [p2p(0, "send", 1, 1, "completed", "pp"), p2p(1, "send", 1, 2, "completed", "pp"),
                   p2p(2, "recv", 1, 1, "started", "pp")], groups=groups, world=2)
    r1 = trace(1, [p2p(0, "recv", 0, 1, "completed", "pp"), p2p(1, "recv", 0, 2, "completed", "pp"),
                   p2p(2, "recv", 0, 3, "started", "pp")], groups=groups, world=2)
    report = load(tmp_path, [r0, r1])
    assert found(report) == [("p2p_deadlock", [0, 1], "pp", 1, "recv")]
    assert "rank 0 sent only 2 messages to rank 1, which waits for its 3rd" in report.findings[0].detail


def test_a_send_and_recv_that_disagree_on_size_name_sender_then_receiver_undecided(tmp_path):
    """Rank 2 sends 8 floats to rank 0, which posted a recv for 4: two sides and no majority, so the finding lists
    them in rank order and says one of them is wrong, never which."""
    r0 = trace(0, [p2p(0, "recv", 2, 1, "completed")], world=4)
    r0.entries[0].out_sizes = [[4]]
    r2 = trace(2, [p2p(0, "send", 0, 1, "completed")], world=4)
    report = load(tmp_path, [r0, trace(1, [], world=4), r2, trace(3, [], world=4)])
    f = next(f for f in report.findings if f.kind == "p2p_deadlock")
    assert f.ranks == [0, 2]
    assert "one of ranks 0, 2 is wrong" in f.detail and "cannot tell which" in f.detail


def test_a_stale_mark_does_not_put_a_rank_fifteen_collectives_back(tmp_path):
    """Ranks 0, 1, 3 never saw all_reduce #1-#15 marked completed (async calls never waited on), though rank 2
    completed every one of them with them, then went on to #16 alone. Before, the verdict said ranks 0, 1, 3 were
    still in all_reduce #1 and that the others went on to #16: two numbers 15 calls apart in one sentence. Taking
    part in a collective a peer completed shows a rank left the one before: they are in #15, the step before #16."""
    traces = [trace(r, [coll(i, i + 1) for i in range(15)] + [coll(15, 16, state="started")]) if r == 2 else
              trace(r, [coll(i, i + 1, state="started") for i in range(15)]) for r in WORLD]
    report = load(tmp_path, traces)
    assert found(report)[0] == ("state_mismatch", [0, 1, 3], "0", 15, "all_reduce")
    assert report.findings[0].detail.startswith(
        "all_reduce #15 on the default group '0' completed on rank 2 but ranks 0, 1, 3 are still in it. The others "
        "went on to all_reduce #16, which ranks 0, 1, 3 never reached.")
    assert all(report.ranks[str(r)]["pending"][0]["seq"] == 15 for r in (0, 1, 3))


def test_a_call_site_numbered_in_another_group_says_which_group(tmp_path):
    """Rank 1 never joins all_reduce #1 on the default group; its last call was all_reduce #7 on its own group
    '1'. The code line must say the group its #7 belongs to, not read as a #7 of the default group."""
    last = coll(0, 7, group="1")
    last.frames = [Frame("<module>", "train.py", 1), Frame("log_metrics", "train.py", 12)]
    r0 = trace(0, [coll(0, 1, state="started")], groups={"0": [0, 1]}, world=2)
    r1 = trace(1, [last], groups={"0": [0, 1], "1": [1]}, world=2)
    report = load(tmp_path, [r0, r1])
    assert found(report) == [("missing_ranks", [1], "0", 1, "all_reduce")]
    assert "rank 1 last called all_reduce #7 on group '1' from log_metrics (train.py:12)" in report.findings[0].detail
