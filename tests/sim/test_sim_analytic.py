"""Pipeline schedules against the analytic results: bubble (P-1)/(M+P-1) and 1F1B's P-s live activations."""

import pytest

from distdoctor.sim.ir import check_program
from distdoctor.sim.plans.pipeline import PipelineConfig, build_pipeline, schedule_order
from distdoctor.sim.result import simulate


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P,M", [(2, 2), (4, 8), (4, 5), (8, 16), (3, 12)])
def test_bubble_fraction_matches_analytic(schedule, P, M):
    cfg = PipelineConfig(stages=P, microbatches=M, schedule=schedule, streams=1, zero_comm=True, act_buffer=M,
                         fwd_us=100, bwd_us=200)
    out = simulate(build_pipeline(cfg)).to_json()
    assert out["deadlock"] is False
    expected = (P - 1) / (M + P - 1)
    assert out["bubble_fraction"] == pytest.approx(expected, rel=0.01)
    assert out["makespan_us"] == pytest.approx((M + P - 1) * 300)


def test_bubble_with_dp_and_tp_and_zero_comm_is_unchanged():
    cfg = PipelineConfig(stages=4, microbatches=8, dp=2, tp=2, streams=1, zero_comm=True, act_buffer=8)
    out = simulate(build_pipeline(cfg)).to_json()
    assert out["bubble_fraction"] == pytest.approx(3 / 11, rel=0.01)


@pytest.mark.parametrize("P,M", [(4, 8), (8, 32), (4, 3)])
def test_1f1b_peak_live_activations_is_p_minus_stage(P, M):
    # Unbounded buffer (M slots): the peak is what the schedule itself keeps alive.
    cfg = PipelineConfig(stages=P, microbatches=M, schedule="1f1b", streams=1, zero_comm=True, act_buffer=M)
    out = simulate(build_pipeline(cfg)).to_json()
    for s in range(P):
        assert out["buffers"][f"{s}/act"]["peak"] == min(P - s, M), s


def test_gpipe_keeps_all_microbatches_alive():
    cfg = PipelineConfig(stages=4, microbatches=6, schedule="gpipe", streams=1, zero_comm=True, act_buffer=6)
    out = simulate(build_pipeline(cfg)).to_json()
    assert {v["peak"] for v in out["buffers"].values()} == {6}


@pytest.mark.parametrize("P,V,M", [(4, 2, 8), (2, 3, 4), (4, 2, 4)])
def test_interleaved_bubble_shrinks_by_chunks(P, V, M):
    cfg = PipelineConfig(stages=P, microbatches=M, schedule="interleaved", chunks=V, streams=1, zero_comm=True,
                         act_buffer=M * V, fwd_us=10, bwd_us=20)
    out = simulate(build_pipeline(cfg)).to_json()
    assert out["deadlock"] is False
    # Megatron-LM: bubble time (P-1)/V of a micro-batch's fwd+bwd, against M micro-batches of work.
    assert out["bubble_fraction"] == pytest.approx((P - 1) / (V * M + P - 1), rel=0.01)


def test_schedule_orders_are_complete_and_balanced():
    for schedule, V in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        cfg = PipelineConfig(stages=4, microbatches=8, schedule=schedule, chunks=V)
        for s in range(4):
            order = schedule_order(cfg, s)
            assert sorted(x for x in order if x[0] == "F") == [("F", m, c) for m in range(8) for c in range(V)]
            assert sorted(x for x in order if x[0] == "B") == [("B", m, c) for m in range(8) for c in range(V)]


@pytest.mark.parametrize("schedule,streams", [("gpipe", 1), ("gpipe", 2), ("1f1b", 1), ("1f1b", 2),
                                              ("interleaved", 1)])
def test_generated_plans_run_with_communication_and_steps(schedule, streams):
    cfg = PipelineConfig(stages=4, microbatches=4, schedule=schedule, chunks=2 if schedule == "interleaved" else 1,
                         dp=2, tp=2, streams=streams, steps=2)
    prog = build_pipeline(cfg)
    check_program(prog)  # generators emit programs that pass the same checks as a user's file
    out = simulate(prog).to_json()
    assert out["deadlock"] is False
    assert out["ops_executed"] == out["ops"]
    assert 0 < out["bubble_fraction"] < 1


def test_one_slot_buffer_serializes_but_runs_with_backward_feed_on_bwd():
    loose = simulate(build_pipeline(PipelineConfig(stages=2, microbatches=4, dp=2, tp=2))).to_json()
    tight = simulate(build_pipeline(PipelineConfig(stages=2, microbatches=4, dp=2, tp=2, act_buffer=1))).to_json()
    assert not loose["deadlock"] and not tight["deadlock"]
    assert tight["makespan_us"] > loose["makespan_us"]


def test_interleaved_with_blocking_sends_on_compute_streams_deadlocks_around_the_ring():
    # With --streams 2 receives are inline on the consuming stream, so a send blocks until the peer's forward
    # stream reaches its receive. Interleaving wraps stage P-1 back to stage 0 (chunk 1) while stage 0 still
    # sends chunk 0: a cycle of sends around the ring (why Megatron-LM batches isend/irecv for this schedule).
    cfg = PipelineConfig(stages=4, microbatches=4, schedule="interleaved", chunks=2, streams=2)
    out = simulate(build_pipeline(cfg)).to_json()
    assert out["deadlock"] is True
    assert [c["stream"] for c in out["cycle"]] == ["fwd"] * 4
    assert [c["rank"] for c in out["cycle"]] == [0, 1, 2, 3]
    assert all(c["op"].startswith("send to") for c in out["cycle"])
