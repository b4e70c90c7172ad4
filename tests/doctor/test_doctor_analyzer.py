"""The analyzer on hand-made native traces (what the recorder and the simulator write): p2p deadlocks, root and
type mismatches, stacks that say where an absent rank is, and simulated traces explained in the same words."""

import json

from distdoctor.diagnose import analyze
from distdoctor.report.diagnose_text import render_text
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, dumps

WORLD = [0, 1, 2, 3]


def trace(rank, entries, groups=None, stacks=None, source="native", world=4):
    groups = groups or {"0": list(range(world))}
    return RankTrace(rank=rank, source=source, world_size=world, entries=entries, stacks=stacks,
                     groups={n: GroupInfo(n, m) for n, m in groups.items()}, dump_reason="hang")


def coll(i, seq, op="all_reduce", group="0", state="completed", sizes=((8,),), dtype="float32", root=None,
         stream=None, out=None, t=None):
    return Entry(index=i, group=group, op=op, seq=seq, in_sizes=[list(s) for s in sizes],
                 out_sizes=[list(s) for s in (out or sizes)], in_dtypes=[dtype], out_dtypes=[dtype], root=root,
                 state=state, stream=stream, t_created=t)


def p2p(i, op, peer, seq, state="issued", group="0", stream=None):
    return Entry(index=i, group=group, op=op, p2p_seq=seq, peer=peer, in_sizes=[[8]], out_sizes=[[8]],
                 in_dtypes=["float32"], out_dtypes=["float32"], state=state, stream=stream)


def load(tmp_path, traces):
    for t in traces:
        (tmp_path / f"trace_rank_{t.rank}.jsonl").write_text(dumps(t))
    ts = load_traces([str(tmp_path)])
    assert ts.errors == []
    return analyze(ts)


def found(report):
    return [(f.kind, f.ranks, f.group, f.seq, f.op) for f in report.findings]


def test_both_receive_first_is_a_p2p_deadlock(tmp_path):
    traces = [trace(r, [coll(0, 1), *( [p2p(1, "recv", 1 - r, 1)] if r < 2 else [coll(1, 2, state="issued")])])
              for r in WORLD]
    report = load(tmp_path, traces)
    assert found(report)[0] == ("p2p_deadlock", [0, 1], "0", 1, "recv")
    f = report.findings[0]
    assert "receives before it sends" in f.detail and "rank 0 waits in recv from rank 1" in f.detail
    # ranks 2 and 3 wait in all_reduce #2 for 0 and 1, which are stuck in the p2p: a consequence, not a finding
    assert [x.kind for x in report.findings] == ["p2p_deadlock"]


def test_send_first_on_one_side_is_fine(tmp_path):
    traces = [trace(0, [p2p(0, "send", 1, 1, state="completed"), p2p(1, "recv", 1, 1, state="completed")], world=2),
              trace(1, [p2p(0, "recv", 0, 1, state="completed"), p2p(1, "send", 0, 1, state="completed")], world=2)]
    report = load(tmp_path, traces)
    assert report.verdict == "ok" and report.findings == []


def test_p2p_peers_disagree_on_size(tmp_path):
    a = trace(0, [p2p(0, "send", 1, 1, state="completed")], world=2)
    b_recv = p2p(0, "recv", 0, 1, state="completed")
    b_recv.out_sizes = [[16]]
    report = load(tmp_path, [a, trace(1, [b_recv], world=2)])
    assert found(report) == [("p2p_deadlock", [0, 1], "0", 1, "send")]
    assert "[[8]]" in report.findings[0].detail and "[[16]]" in report.findings[0].detail


def test_root_and_type_mismatch_culprits_are_the_minority(tmp_path):
    traces = []
    for r in WORLD:
        entries = [coll(0, 1, op="broadcast", root=3 if r == 2 else 0),
                   coll(1, 2, op="all_gather" if r == 1 else "all_reduce", out=((32,),) if r == 1 else None)]
        traces.append(trace(r, entries))
    report = load(tmp_path, traces)
    assert found(report) == [("root_mismatch", [2], "0", 1, "broadcast")]  # first divergence ends the group scan
    traces = [trace(r, [coll(0, 1, op="all_gather" if r == 1 else "all_reduce", out=((32,),) if r == 1 else None)])
              for r in WORLD]
    report = load(tmp_path, traces)
    assert found(report) == [("type_mismatch", [1], "0", 1, "all_reduce")]


def test_all_gather_size_relation_uses_the_spec(tmp_path):
    traces = [trace(r, [coll(0, 1, op="all_gather", sizes=((4,),), out=((12,) if r == 3 else (16,),))])
              for r in WORLD]
    report = load(tmp_path, traces)
    assert found(report) == [("size_mismatch", [3], "0", 1, "all_gather")]
    assert "n x input" in report.findings[0].detail


def test_absent_rank_stack_says_where_it_is(tmp_path):
    stack = [Frame("<module>", "train.py", 80), Frame("train_loop", "train.py", 61),
             Frame("__next__", "/x/site-packages/torch/utils/data/dataloader.py", 630),
             Frame("load_batch", "data.py", 17)]
    traces = [trace(r, [coll(0, 1), coll(1, 2, state="issued")] if r != 3 else [coll(0, 1)],
                    stacks={"MainThread": stack} if r == 3 else None) for r in WORLD]
    report = load(tmp_path, traces)
    assert found(report) == [("missing_ranks", [3], "0", 2, "all_reduce")]
    f = report.findings[0]
    assert "last completed collective was all_reduce #1" in f.detail and "load_batch (data.py:17)" in f.detail
    assert f.evidence["now"]["3"] == "load_batch (data.py:17)"
    assert report.ranks["3"]["now"] == "load_batch (data.py:17)"
    assert report.ranks["0"]["pending"][0]["seq"] == 2


def test_simulated_trace_gets_the_same_words(tmp_path):
    """The simulator writes one trace per rank, one pseudo-thread per stream; a plan whose two groups are used in
    different orders on two streams must read as an order_deadlock, like the real one."""
    groups = {"0": WORLD, "tp": [0, 1], "dp": [0, 1]}
    r0 = trace(0, [coll(0, 1, group="tp", state="issued", stream="fwd")], groups=groups, source="simulated", world=2)
    r1 = trace(1, [coll(0, 1, group="dp", state="issued", stream="fwd")], groups=groups, source="simulated", world=2)
    for t in (r0, r1):
        t.groups["0"] = GroupInfo("0", [0, 1])
    report = load(tmp_path, [r0, r1])
    assert found(report) == [("order_deadlock", [0, 1], "dp", 1, "all_reduce")] or \
        found(report) == [("order_deadlock", [0, 1], "tp", 1, "all_reduce")]
    f = report.findings[0]
    assert f.groups == ["dp", "tp"]
    assert "rank 0 waits in group 'tp' all_reduce #1 for rank 1" in f.detail
    assert json.loads(json.dumps(report.to_json()))["findings"][0]["kind"] == "order_deadlock"


def test_multi_stream_ranks_reach_a_collective_only_when_the_stream_is_free(tmp_path):
    """Rank 1 issued tp#1 on stream 'comm' but that stream is still stuck in dp#1 behind rank 0: a cycle."""
    groups = {"0": [0, 1], "tp": [0, 1], "dp": [0, 1]}
    r0 = trace(0, [coll(0, 1, group="tp", state="issued", stream="comm"),
                   coll(1, 1, group="dp", state="issued", stream="comm")], groups=groups, world=2)
    r1 = trace(1, [coll(0, 1, group="dp", state="issued", stream="comm"),
                   coll(1, 1, group="tp", state="issued", stream="comm")], groups=groups, world=2)
    report = load(tmp_path, [r0, r1])
    assert [(f.kind, f.ranks) for f in report.findings] == [("order_deadlock", [0, 1])]


def test_state_mismatch_and_world_size_from_flag(tmp_path):
    traces = [trace(r, [coll(0, 1, state="issued" if r == 2 else "completed")], world=3) for r in range(3)]
    for t in traces:
        (tmp_path / f"r{t.rank}.jsonl").write_text(dumps(t))
    ts = load_traces([str(tmp_path)], world_size=4)
    report = analyze(ts)
    assert ts.world_size == 4
    kinds = found(report)
    assert kinds[0][:2] == ("missing_dump", [3])
    assert ("state_mismatch", [2], "0", 1, "all_reduce") not in kinds  # a lost member explains it


def test_ok_traces_are_ok(tmp_path):
    report = load(tmp_path, [trace(r, [coll(i, i + 1) for i in range(10)]) for r in WORLD])
    assert report.verdict == "ok" and report.ranks["2"]["completed"] == {"0": 10}


def test_html_escapes_every_string_from_a_dump(tmp_path, run_cli):
    evil = "<script>alert(1)</script>"
    traces = [trace(r, [coll(0, 1, group=evil, state="issued" if r else "completed")],
                    groups={"0": [0, 1], evil: [0, 1]}, world=2,
                    stacks={"MainThread": [Frame(evil, f"/x/{evil}.py", 3)]}) for r in (0, 1)]
    for t in traces:
        (tmp_path / f"rank_{t.rank}.jsonl").write_text(dumps(t))
    res = run_cli("diagnose", str(tmp_path), "--format", "html")
    assert res.returncode == 1, res.stderr
    assert evil not in res.stdout and "&lt;script&gt;alert(1)&lt;/script&gt;" in res.stdout
    assert "<script" not in res.stdout


def test_native_trace_with_wrong_types_is_a_load_error(tmp_path):
    good = trace(0, [coll(0, 1)], world=1)
    text = dumps(good).replace('"seq": 1', '"seq": "one"')
    (tmp_path / "rank_0.jsonl").write_text(text)
    (tmp_path / "rank_1.jsonl").write_text(dumps(trace(1, [coll(0, 1)], world=2))[:-40])
    ts = load_traces([str(tmp_path)])
    reasons = sorted(e.reason for e in ts.errors)
    assert reasons[0] == "entry 0 (line 2): seq 'one' is not an integer"
    assert "truncated" in reasons[1] or "not JSON" in reasons[1]


def test_simulated_send_to_a_peer_stuck_on_a_buffer(tmp_path):
    """The seed's pipeline hang, as the simulator writes it: stage-1 ranks block sending gradients to stage-0 ranks,
    whose backward stream never posts the recv (it waits for an event the forward stream, stuck acquiring a
    one-slot buffer, would record)."""
    groups = {"0": [0, 1], "world": [0, 1]}
    stuck = {"fwd": [Frame("acquire buffer act", "plan.yaml:rank0/fwd", 5)],
             "bwd": [Frame("wait event grad_in0", "plan.yaml:rank0/bwd", 0)]}
    r0 = trace(0, [p2p(0, "send", 1, 1, state="completed", group="world", stream="fwd")], groups=groups,
               stacks=stuck, source="simulated", world=2)
    r1 = trace(1, [p2p(0, "recv", 0, 1, state="completed", group="world", stream="fwd"),
                   p2p(1, "send", 0, 1, state="issued", group="world", stream="bwd")], groups=groups,
               source="simulated", world=2)
    report = load(tmp_path, [r0, r1])
    assert found(report) == [("missing_ranks", [0], "world", 1, "send")]
    d = report.findings[0].detail
    assert "rank 1 waits in send #1 to rank 0" in d and "never posted the matching recv" in d
    assert "its streams are now at fwd: acquire buffer act (plan.yaml:rank0/fwd:5); bwd: wait event grad_in0" in d


def test_a_stopped_rank_is_one_finding_not_one_per_group(tmp_path):
    """Rank 3 stops: it is absent from the next collective of the default group and of its subgroup; the first
    in time is the finding, the other a consequence named in its detail."""
    groups = {"0": WORLD, "1": [2, 3]}
    traces = []
    for r in WORLD:
        entries = [coll(0, 1, t=1.0), coll(1, 1, group="1", t=2.0)] if r in (2, 3) else [coll(0, 1, t=1.0)]
        if r != 3:
            entries.append(coll(len(entries), 2, state="issued", t=3.0))
        if r == 2:
            entries.insert(2, coll(2, 2, group="1", state="completed", t=2.5))  # rank 2 went on in group 1
            entries[-1].index = 3
        traces.append(trace(r, entries, groups=groups))
    report = load(tmp_path, traces)
    assert found(report) == [("missing_ranks", [3], "1", 2, "all_reduce")]
    assert "never reached all_reduce #2 on group '0'" in report.findings[0].detail
    assert {"kind": "missing_ranks", "group": "0", "seq": 2, "op": "all_reduce", "ranks": [3],
            "because": "the same ranks are already missing from an earlier collective", "finding": 0,
            "finding_ref": {"kind": "missing_ranks", "group": "1", "seq": 2}} in report.consequences


def _fr_json_dumps(tmp_path, n_entries, tweak):
    """Four ranks of Flight Recorder JSON: all_reduce / all_gather / all_reduce on the default group, every entry
    completed but the last; `tweak(rank, i, entry)` plants a fault."""
    for rank in range(4):
        entries = []
        for i in range(n_entries):
            op = "all_gather" if i % 3 == 1 else "all_reduce"
            e = {"record_id": i, "process_group": ["0", "default_pg"], "collective_seq_id": i + 1,
                 "p2p_seq_id": 0, "profiling_name": f"nccl:{op}", "time_created_ns": 10**18 + i * 10**6 + rank,
                 "input_sizes": [[16]], "output_sizes": [[64]] if op == "all_gather" else [[16]],
                 "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "completed",
                 "retired": i < n_entries - 1, "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0,
                 "is_p2p": False, "thread_name": "pt_main_thread"}
            if i == n_entries - 1:
                e["state"] = "scheduled"
            tweak(rank, i, e)
            entries.append(e)
        dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
                "entries": entries}
        (tmp_path / f"rank_{rank}.json").write_text(json.dumps(dump))
    return [(f.kind, f.ranks, f.seq, f.op) for f in analyze(load_traces([str(tmp_path)])).findings]


def test_divergence_inside_a_long_agreed_run_is_found_where_it_is(tmp_path):
    """The agreed prefix is proven from columns, not walked: a mismatch deep inside must still stop it there."""
    def tweak(rank, i, e):
        if rank == 2 and i == 700:
            e["input_sizes"] = [[32]]
            e["output_sizes"] = [[32]]
    assert _fr_json_dumps(tmp_path, 1000, tweak) == [("size_mismatch", [2], 701, "all_gather")]


def test_a_size_relation_is_checked_across_members_not_per_call(tmp_path):
    """all_gather over 4 ranks needs out = 4 x in, per member; but when every member recorded the very same sizes,
    the transport agreed with them (tensor parallel + FSDP2: a DTensor's all_gather records an output with a
    leading dimension of its own): no size_mismatch. One member that breaks the relation alone is still found,
    deep inside the agreed prefix."""
    def alike(rank, i, e):
        if i == 400:  # an all_gather (i % 3 == 1)
            e["output_sizes"] = [[48]]
    assert _fr_json_dumps(tmp_path, 900, alike) == []  # (NCCL: every member reached the last all_reduce: in flight)

    def one(rank, i, e):
        if i == 400 and rank == 1:
            e["output_sizes"] = [[48]]
    assert _fr_json_dumps(tmp_path, 900, one) == [("size_mismatch", [1], 401, "all_gather")]


def test_calls_every_member_reached_under_nccl_are_in_flight_never_ok(tmp_path):
    """An NCCL dump whose ranks all sit in a collective every member reached: no finding blames anyone (a healthy
    job dumped mid-flight looks so), yet the verdict is not `ok` (a hang inside the transport looks so too)."""
    assert _fr_json_dumps(tmp_path, 30, lambda rank, i, e: None) == []
    report = analyze(load_traces([str(tmp_path)]))
    assert report.verdict == "in_flight" and report.in_flight_ranks() == [0, 1, 2, 3]
    text = render_text(report)
    assert text.startswith("verdict: IN FLIGHT - 0 findings") and "ranks 0-3 run collectives every member" in text
    assert "No desync, hang or straggler found" not in text


def test_a_long_healthy_run_with_one_rank_still_in_the_last_collective(tmp_path):
    def tweak(rank, i, e):
        if i == 899 and rank != 3:
            e["retired"] = True
    assert _fr_json_dumps(tmp_path, 900, tweak) == [("state_mismatch", [3], 900, "all_reduce")]


def test_the_agreed_prefix_is_proven_up_to_the_first_difference(tmp_path):
    from distdoctor.diagnose.match import agreed_prefix, build_views

    def tweak(rank, i, e):
        if rank == 1 and i == 600:
            e["input_dtypes"] = ["Half"]
    _fr_json_dumps(tmp_path, 800, tweak)
    view = build_views(load_traces([str(tmp_path)]))["0"]
    seqs = {r: sorted(m) for r, m in view.by_rank.items()}
    assert agreed_prefix(view, 1, seqs) == 600  # seqs 1..600 agree; 601 is where rank 1 differs
    assert agreed_prefix(view, 650, seqs) == 799 - 650 + 1  # through seq 799, the last every rank completed


def test_text_report_of_a_big_world_lists_the_named_ranks_first():
    from distdoctor.report.diagnose_text import render_text
    from distdoctor.trace.model import TraceSet

    world = 40
    ts = TraceSet(world_size=world)
    for r in range(world):
        entries = [coll(0, 1)] + ([] if r == 37 else [coll(1, 2, state="started")])
        ts.ranks[r] = trace(r, entries, world=world)
    text = render_text(analyze(ts))
    rank_lines = text.split("where each rank is:\n", 1)[1].splitlines()
    assert rank_lines[0].startswith("  rank 37: 1 collectives completed") and "in no collective" in rank_lines[0]
    assert rank_lines[1].startswith("  rank 0:") and "... 8 more ranks" in text


def test_a_rank_that_died_of_its_lost_peers_before_the_next_call_is_no_absent_rank(tmp_path):
    """Ranks 2 and 3 were lost with their host. Rank 0 issued all_reduce #3; rank 1 died of the closed connection
    just before it could: it is absent from #3 because of the lost ranks, not a second culprit."""
    def died(rank, entries, message):
        t = trace(rank, entries)
        t.dump_reason = f"exception: RuntimeError: {message}"
        t.exception = {"type": "RuntimeError", "message": message, "thread": "MainThread", "exit_code": 1}
        return t
    reset = "[pair.cc:537] Read error [10.0.0.2]:52406: Connection reset by peer"
    closed = "[pair.cc:553] Connection closed by peer [10.0.0.1]:59112"
    report = load(tmp_path, [died(0, [coll(0, 1), coll(1, 2), coll(2, 3, state="issued")], closed),
                             died(1, [coll(0, 1), coll(1, 2)], reset)])
    assert found(report) == [("missing_dump", [2, 3], "0", 3, "all_reduce")], report.findings
    echo = [c for c in report.consequences if c["kind"] == "missing_ranks"]
    assert echo and echo[0]["ranks"] == [1] and echo[0]["finding"] == 0, report.consequences
    # Were rank 1's death its own (no communication failure), it would be a finding of its own.
    report = load(tmp_path, [died(0, [coll(0, 1), coll(1, 2), coll(2, 3, state="issued")], closed),
                             died(1, [coll(0, 1), coll(1, 2)], "ValueError in the data loader")])
    assert ("crashed", [1]) in [(k, r) for k, r, *_ in found(report)], report.findings


def test_a_world_sized_hang_finds_who_is_behind_once_per_call(monkeypatch):
    """Every member pending in the same collective of the world-sized group has the same members behind it:
    they are found once per call, not once per member (which made a 4096-rank hang 16 million lookups), and each
    member's wait still names them."""
    from distdoctor.diagnose import waitfor

    world, lost = 64, 37
    ts_ranks = {}
    for r in range(world):
        t = RankTrace(rank=r, source="native", world_size=world,
                      groups={"0": GroupInfo("0", list(range(world)))})
        for seq in range(1, 5 if r != lost else 4):
            t.entries.append(Entry(index=seq - 1, group="0", op="all_reduce", seq=seq, in_sizes=[[4]],
                                   out_sizes=[[4]], in_dtypes=["float32"], out_dtypes=["float32"],
                                   state="completed" if seq < 4 else "started"))
        ts_ranks[r] = t
    calls = []
    behind = waitfor._behind
    monkeypatch.setattr(waitfor, "_behind", lambda *a: calls.append(a[0].seq) or behind(*a))
    from distdoctor.trace.model import TraceSet

    report = analyze(TraceSet(ranks=ts_ranks, world_size=world))
    assert calls == [4]
    first = report.findings[0]
    assert (first.kind, first.ranks, first.group, first.seq) == ("missing_ranks", [lost], "0", 4)
