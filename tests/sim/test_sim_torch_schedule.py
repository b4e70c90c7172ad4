"""torch.distributed.pipelining's own schedules in the simulator: every class torch ships, its action lists
checked as torch checks them, broken lists reported problem by problem, and torch's CSV form both ways."""

import json

import pytest

torch = pytest.importorskip("torch")

from distdoctor.cli import main  # noqa: E402
from distdoctor.sim.ir import check_program  # noqa: E402
from distdoctor.sim.plans.schedule_actions import check_actions, read_csv, write_csv  # noqa: E402
from distdoctor.sim.plans.schedule_program import ScheduleTiming  # noqa: E402
from distdoctor.sim.plans.torch_schedule import schedule_actions, schedule_classes  # noqa: E402
from distdoctor.sim.result import simulate  # noqa: E402
from distdoctor.sim.schedule_report import load_schedule  # noqa: E402

ZERO_COMM = ScheduleTiming(fwd_us=100, bwd_us=200, p2p_us=0)
TORCH_213 = torch.__version__.startswith("2.13")
# torch 2.13's Schedule1F1B.pipeline_order skips micro-batch 0 on the last stage (see the test below)
BROKEN_IN_213 = {"1F1B"} if TORCH_213 else set()


def _combos(cls) -> list[tuple[int, int, int]]:
    """(stages, ranks, microbatches) the class accepts: one stage per rank for single-stage classes."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    if issubclass(cls, PipelineScheduleSingle):
        return [(4, 4, 8), (2, 2, 3)]
    return [(8, 4, 8), (4, 2, 6)]


def run(args, capsys):
    with pytest.raises(SystemExit) as ex:
        main(["sim", "torch-schedule", *map(str, args)])
    out = capsys.readouterr()
    return ex.value.code, out.out, out.err


def test_discovers_every_schedule_torch_ships():
    found = set(schedule_classes())
    assert {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"} <= found
    if TORCH_213:
        assert found == {"GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble",
                         "ZBVZeroBubble", "DualPipeV"}


@pytest.mark.parametrize("name", sorted(set(schedule_classes()) - BROKEN_IN_213))
@pytest.mark.parametrize("comm_model", ["nccl", "ideal"])
def test_every_torch_schedule_runs_without_deadlock(name, comm_model):
    cls = schedule_classes()[name]
    for stages, ranks, mbs in _combos(cls):
        loaded = load_schedule(name, None, stages, mbs, ranks, ZERO_COMM, comm_model)
        assert loaded.findings == [], [f.detail for f in loaded.findings]
        check_program(loaded.program)
        out = simulate(loaded.program).to_json()
        assert out["deadlock"] is False and out["ops_executed"] == out["ops"]
        work = mbs * (stages // ranks) * 300  # each rank: F + B (or I + W) per micro-batch and stage
        assert {round(v["busy_us"]) for k, v in out["streams"].items() if k.endswith("/compute")} == {work}
        # sane: the step takes at least one rank's work, and less than running every stage one after another
        assert work <= out["makespan_us"] < work * ranks
        assert 0 <= out["bubble_fraction"] < (ranks - 1) / ranks
        peaks = [v["peak"] for v in out["buffers"].values()]
        assert 1 <= max(peaks) <= mbs * (stages // ranks)


@pytest.mark.parametrize("P,M", [(4, 8), (2, 3), (8, 16)])
def test_gpipe_bubble_is_the_analytic_one(P, M):
    loaded = load_schedule("GPipe", None, P, M, P, ZERO_COMM)
    out = simulate(loaded.program).to_json()
    assert out["bubble_fraction"] == pytest.approx((P - 1) / (M + P - 1), abs=1e-6)
    assert out["makespan_us"] == pytest.approx((M + P - 1) * 300)
    assert loaded.lowered is True  # GPipe's list has no sends: torch's runtime lowering added them


def test_interleaved_bubbles_against_the_analytic_one_and_the_stream_model():
    P, V, M = 4, 2, 8
    analytic = (P - 1) / (V * M + P - 1)
    bubble = {}
    names = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
    for name in names:
        for model in ("ideal", "nccl", "coalesced"):
            prog = load_schedule(name, None, P * V, M, P, ZERO_COMM, model).program
            bubble[name, model] = simulate(prog).to_json()["bubble_fraction"]
    # without false waits, torch's interleaved 1F1B and looped BFS reach Megatron-LM's (P-1)/(V*M+P-1) ...
    assert bubble["Interleaved1F1B", "ideal"] == pytest.approx(analytic, abs=1e-6)
    assert bubble["LoopedBFS", "ideal"] == pytest.approx(analytic, abs=1e-6)
    # ... the zero-bubble schedules fill part of it with weight gradients ...
    assert bubble["InterleavedZeroBubble", "ideal"] < analytic and bubble["ZBVZeroBubble", "ideal"] < analytic
    # ... a stream per peer pair (torch 2.13 sends lone ops on 2-rank communicators) keeps that for the first four,
    # and one coalesced stream per rank loses it: receives posted early wait behind computes they do not need
    for name in names:
        assert bubble[name, "ideal"] <= bubble[name, "nccl"] <= bubble[name, "coalesced"]
    for name in names[:4]:
        assert bubble[name, "nccl"] == pytest.approx(bubble[name, "ideal"], abs=1e-6)
    assert bubble["Interleaved1F1B", "coalesced"] > 1.5 * analytic and bubble["LoopedBFS", "coalesced"] > 1.5 * analytic


def _has_defer_recv() -> bool:
    import inspect

    return "defer_pp_recv" in inspect.signature(schedule_classes()["Interleaved1F1B"].__init__).parameters


@pytest.mark.skipif(not _has_defer_recv(), reason="this torch has no defer_pp_recv")
def test_deferred_receives_deadlock_with_rendezvous_sends_and_cross_v_schedule_messages():
    timing = ScheduleTiming(p2p_bytes=8 << 20)
    # torch's rank-parity rule flushes only receives that were already deferred: on 2 ranks both post a send
    # before the receive the other's send needs
    loaded = load_schedule("Interleaved1F1B", None, 4, 8, 2, timing, defer_recv=True)
    res = simulate(loaded.program).to_json()
    assert res["deadlock"] is True
    assert [(c["rank"], c["stream"], c["op"]) for c in res["cycle"]] == [
        (0, "p2p_next", "send to 1 (act s2->s3 mb1)"), (1, "p2p_next", "send to 0 (grad s3->s2 mb0)")]
    # it runs while the tensors fit the peers' buffers (NCCL's eager sends), and without deferral
    eager = ScheduleTiming(p2p_bytes=8 << 20, eager_bytes=8 << 20)
    assert not simulate(load_schedule("Interleaved1F1B", None, 4, 8, 2, eager, defer_recv=True).program).deadlock
    assert not simulate(load_schedule("Interleaved1F1B", None, 4, 8, 2, timing).program).deadlock
    # a V schedule's deferred receives come in consumer order, not in the order the peer sends
    loaded = load_schedule("ZBVZeroBubble", None, 4, 8, 2, timing, defer_recv=True)
    assert [(f.kind, f.ranks) for f in loaded.findings] == [("p2p_order_mismatch", [0, 1])]
    assert loaded.program is None


@pytest.mark.skipif(not TORCH_213, reason="the defect is torch 2.13's")
def test_torch_2_13_schedule1f1b_action_list_is_reported_invalid(capsys):
    code, out, err = run(["1F1B", "--stages", 4, "--microbatches", 8, "--format", "json"], capsys)
    assert code == 1 and err == ""
    doc = json.loads(out)
    assert doc["valid"] is False and doc["torch_schedule"]["schedule"] == "Schedule1F1B"
    got = {(f["kind"], f["stage"], f["microbatch"]) for f in doc["findings"]}
    # the last stage starts its steady state at micro-batch 1 (forward_mb += 1 before the first forward)
    assert got == {("missing_microbatch", 3, 0), ("backward_before_forward", 3, 0), ("unknown_microbatch", 3, 8)}
    assert all(f["ranks"] == [3] for f in doc["findings"])


def _gpipe_rows(comms: bool) -> dict:
    ts = schedule_actions("GPipe", 4, 6, 4)
    if comms:
        return {r: list(a) for r, a in ts.actions.items()}
    from torch.distributed.pipelining.schedules import ScheduleGPipe

    from distdoctor.sim.plans.torch_schedule import _convert, _StubStage

    sched = ScheduleGPipe(_StubStage(0, 4, 4), 6)
    return {r: [a for a in _convert(sched.pipeline_order[r]) if a is not None] for r in sched.pipeline_order}


def _edit(rows, rank, old, new=None):
    """Replace (or drop, new=None) the action written `old` on `rank`."""
    i = [str(a) for a in rows[rank]].index(old)
    if new is None:
        del rows[rank][i]
    else:
        from distdoctor.sim.plans.schedule_actions import parse_action

        rows[rank][i] = parse_action(new)
    return rows


def _load_rows(rows, tmp_path, capsys, *extra):
    path = tmp_path / "sched.csv"
    path.write_text(write_csv(rows))
    return run(["--csv", path, "--format", "json", *extra], capsys)


def test_dropped_microbatch_is_reported(tmp_path, capsys):
    rows = _edit(_gpipe_rows(comms=False), 1, "1F3")
    code, out, _ = _load_rows(rows, tmp_path, capsys, "--microbatches", 6)
    assert code == 1
    got = {(f["kind"], tuple(f["ranks"]), f["stage"], f["microbatch"]) for f in json.loads(out)["findings"]}
    assert got == {("missing_microbatch", (1,), 1, 3), ("backward_before_forward", (1,), 1, 3)}


def test_swapped_forward_and_backward_is_reported(tmp_path, capsys):
    rows = _gpipe_rows(comms=False)
    i, j = [str(a) for a in rows[2]].index("2F0"), [str(a) for a in rows[2]].index("2B0")
    rows[2][i], rows[2][j] = rows[2][j], rows[2][i]
    code, out, _ = _load_rows(rows, tmp_path, capsys)
    assert code == 1
    findings = json.loads(out)["findings"]
    assert [(f["kind"], f["ranks"], f["stage"], f["microbatch"], f["step"]) for f in findings] == [
        ("backward_before_forward", [2], 2, 0, i)]
    assert findings[0]["detail"] == (f"rank 2 step {i}: the backward of stage 2 micro-batch 0 (2B0) before its "
                                     f"forward (it comes later, at step {j})")


def test_unmatched_send_and_crossed_receives_are_reported(tmp_path, capsys):
    rows = _edit(_gpipe_rows(comms=True), 2, "2RECV_F4")
    code, out, _ = _load_rows(rows, tmp_path, capsys)
    assert code == 1
    kinds = {(f["kind"], tuple(f["ranks"]), f["microbatch"]) for f in json.loads(out)["findings"]}
    assert ("unmatched_send", (1, 2), 4) in kinds  # rank 1's send of micro-batch 4 has no receive
    assert ("compute_before_recv", (1, 2), 4) in kinds  # 2F4 runs with no receive of its input
    rows = _gpipe_rows(comms=True)
    i, j = [str(a) for a in rows[3]].index("3RECV_F1"), [str(a) for a in rows[3]].index("3RECV_F2")
    rows[3][i], rows[3][j] = rows[3][j], rows[3][i]
    code, out, _ = _load_rows(rows, tmp_path, capsys)
    findings = json.loads(out)["findings"]
    assert code == 1 and [f["kind"] for f in findings] == ["compute_before_recv", "p2p_order_mismatch"]
    assert findings[1]["ranks"] == [2, 3] and "send #2 to rank 3 is 2SEND_F1" in findings[1]["detail"]


def test_a_valid_list_whose_order_deadlocks_gets_the_cycle(tmp_path, capsys):
    # Rank 0 posts the receive of micro-batch 0's gradient before its last activation send, on its one p2p
    # stream: the gradient needs that activation to go through the whole pipeline first.
    rows = _gpipe_rows(comms=True)
    i = [str(a) for a in rows[0]].index("0RECV_B0")
    recv = rows[0].pop(i)
    rows[0].insert([str(a) for a in rows[0]].index("0SEND_F5"), recv)
    assert check_actions(rows, 4, 6, {s: s for s in range(4)}) == []  # torch's checks pass it
    code, out, _ = _load_rows(rows, tmp_path, capsys)
    doc = json.loads(out)
    assert code == 1 and doc["deadlock"] is True and doc["valid"] is True
    assert doc["cycle"][0]["rank"] == 0 and doc["cycle"][0]["op"] == "recv from 1 (grad s1->s0 mb0)"
    assert doc["cycle"][0]["stream"] == "p2p_next"
    assert "rank 0 p2p_next waits to receive from rank 1" in doc["explanation"][0]


def test_csv_round_trip_through_torch(tmp_path, capsys):
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    from distdoctor.sim.plans.torch_schedule import _StubStage

    path = tmp_path / "i1f1b.csv"
    code, by_name, _ = run(["Interleaved1F1B", "--stages", 8, "--microbatches", 8, "--emit-csv", path,
                            "--format", "json"], capsys)
    assert code == 0
    # torch reads the file as a compute+comms schedule and gets the same lists back
    runtime = _PipelineScheduleRuntime([_StubStage(k * 4, 8, 4) for k in range(2)], 8)
    runtime._load_csv(str(path), format="compute_comms")
    assert write_csv({r: [read_csv(str(a), "x")[0][0] for a in acts]
                      for r, acts in runtime.pipeline_order_with_comms.items()}) == path.read_text()
    code, from_csv, _ = run(["--csv", path, "--format", "json"], capsys)
    a, b = json.loads(by_name), json.loads(from_csv)
    assert code == 0 and a["makespan_us"] == b["makespan_us"] and a["streams"] == b["streams"]
    assert b["torch_schedule"]["origin"] == "csv" and b["torch_schedule"]["stages"] == 8


def test_compute_only_csv_from_torch_is_lowered_by_torch(tmp_path, capsys):
    from distdoctor.sim.plans.torch_schedule import _StubStage

    cls = schedule_classes()["InterleavedZeroBubble"]
    sched = cls([_StubStage(k * 2, 4, 2) for k in range(2)], 4)
    path = tmp_path / "zb.csv"
    sched._dump_csv(str(path), format="compute_only")
    code, out, _ = run(["--csv", path, "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["torch_schedule"]["comms_added_by_torch_lowering"] is True
    code, same, _ = run(["InterleavedZeroBubble", "--stages", 4, "--microbatches", 4, "--format", "json"], capsys)
    assert json.loads(same)["makespan_us"] == doc["makespan_us"]


@pytest.mark.parametrize("args,message", [
    (["Interleaved1F1Bx", "--stages", 8, "--microbatches", 8], "Interleaved1F1Bx: unknown torch pipeline schedule"),
    (["GPipe", "--stages", 8, "--microbatches", 8, "--ranks", 4], "--stages: ScheduleGPipe runs one stage per rank"),
    (["ZBVZeroBubble", "--stages", 6, "--microbatches", 8, "--ranks", 2],
     "ScheduleZBVZeroBubble: torch refuses 6 stages on 2 ranks with 8 micro-batches: ZBV requires exactly 2"),
    (["Interleaved1F1B", "--stages", 7, "--microbatches", 8, "--ranks", 2], "--ranks: 7 stages do not divide"),
    (["GPipe", "--csv", "x.csv"], "torch-schedule: give a schedule name"),
    (["GPipe", "--stages", 4], "GPipe: --stages and --microbatches are needed"),
])
def test_bad_input_is_one_line(args, message, capsys):
    code, out, err = run(args, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"distdoctor sim: error: {message}")


def test_bad_csv_cell_names_rank_and_step(tmp_path, capsys):
    (tmp_path / "bad.csv").write_text("0F0,0F1\n1F0,1X1\n")
    code, _, err = run(["--csv", tmp_path / "bad.csv"], capsys)
    assert code == 2 and "bad.csv: rank 1 step 1: '1X1': expected [stage][type][micro-batch]" in err
