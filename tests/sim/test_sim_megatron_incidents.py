"""Examples (d) and (e): Megatron-LM's p2p calls with a fixed op order (#5100) and communicators created in a
different order on different ranks (PR #5240), their fixed twins, and how each depends on the pipeline degree."""

import pytest

from distdoctor.sim.command import examples_dir
from distdoctor.sim.ir import check_program, load_program
from distdoctor.sim.plans.p2p_calls import CallsConfig, build_calls
from distdoctor.sim.plans.pipeline import PipelineConfig
from distdoctor.sim.result import simulate

SHAPES = dict(act_bytes=24)  # _communicate_shapes sends 3 int64: they fit NCCL's buffers
EAGER = 64 << 10


def plan(P, order, schedule="interleaved", init=None, eager=EAGER, M=None, **kw):
    cfg = PipelineConfig(stages=P, microbatches=M or 2 * P, schedule=schedule, chunks=2 if schedule == "interleaved"
                         else 1, **{**SHAPES, **kw})
    prog = build_calls(cfg, CallsConfig(order, init, eager))
    check_program(prog)
    return prog


GENERATED = {  # shipped example -> the generator call that makes it
    "d-megatron-p2p-fixed-order-pp4": lambda: plan(4, "send-first", M=8),
    "d-megatron-p2p-parity-order-pp4": lambda: plan(4, "parity", M=8),
    "e-comm-init-neighbor-first-pp4vp2": lambda: plan(4, "parity", init="neighbors", eager=0, M=8, act_bytes=8 << 20),
    "e-comm-init-rank-order-pp4vp2": lambda: plan(4, "parity", init="eager", eager=0, M=8, act_bytes=8 << 20),
}


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_shipped_examples_are_what_the_generator_emits(name):
    gen, shipped = GENERATED[name](), load_program(examples_dir() / f"{name}.yaml")
    assert gen.ranks == shipped.ranks and gen.groups == shipped.groups and gen.eager_bytes == shipped.eager_bytes


def test_5100_fixed_order_deadlocks_around_the_ring_through_the_cli(sim_cli):
    out = sim_cli("run", "d-megatron-p2p-fixed-order-pp4")
    assert out.returncode == 1, out.stderr
    text = out.stdout
    assert text.startswith("DEADLOCK: 4 of 4 streams on 4 of 4 ranks can never move")
    # every rank waits in recv_prev for its previous rank's send_next, posted after that rank's own recv_prev
    assert ("rank 0 main waits to receive from rank 3 (op 7 `recv from 3 (act vs3->vs4 mb0)`), whose main sends "
            "only at op 3 (`send to 0 (act vs3->vs4 mb0)`), which is stuck before that at op 2 "
            "(`recv from 2 (act vs2->vs3 mb1)`) and waits to receive from rank 2") in text
    assert "waits to receive from rank 1" in text and "the cycle closes" in text
    fixed = sim_cli("run", "d-megatron-p2p-parity-order-pp4", "--trials", "5", "--jitter", "0.5")
    assert fixed.returncode == 0 and fixed.stdout.startswith("No deadlock")


def test_5100_cycle_holds_every_rank_in_recv_prev():
    res = simulate(load_program(examples_dir() / "d-megatron-p2p-fixed-order-pp4.yaml")).to_json()
    assert [(c["rank"], c["op"].split(" (")[0]) for c in res["cycle"]] == [
        (0, "recv from 3"), (3, "recv from 2"), (2, "recv from 1"), (1, "recv from 0")]
    assert res["crossed_messages"] == []


def test_5100_what_the_pipeline_degree_changes():
    """The report's mechanism needs a ring of ranks that each receive before they send. In Megatron-LM's
    interleaved schedule the ranks form one at every PP (P-1 wraps to 0): in this model the fixed order
    deadlocks at PP 2 as well, in the warm-up (Megatron-LM #1450 reports a PP 2 x VPP 2 hang with the same
    settings). Without interleaving there is no ring, and shape-sized (eager) messages never deadlock; only
    rendezvous-sized ones do, at any PP. Under NCCL's group semantics (`batched`) nothing deadlocks, but at PP 2
    prev and next are one peer and the activation and the gradient cross (the silent shape swap of PR #5271)."""
    dead = {P: simulate(plan(P, "send-first")).deadlock for P in (2, 3, 4, 8)}
    assert dead == {2: True, 3: True, 4: True, 8: True}
    assert not any(simulate(plan(P, "parity")).deadlock for P in (2, 4, 8))
    for P in (2, 4):
        assert not simulate(plan(P, "send-first", schedule="1f1b")).deadlock
        assert simulate(plan(P, "send-first", schedule="1f1b", eager=0)).deadlock
    pp2, pp4 = simulate(plan(2, "batched")), simulate(plan(4, "batched"))
    assert not pp2.deadlock and not pp4.deadlock
    assert pp4.crossed() == []
    crossed = pp2.crossed()
    assert len(crossed) == 8 and {(m["src"], m["dst"]) for m in crossed} == {(0, 1), (1, 0)}
    assert {m["send"]["name"].split()[0] for m in crossed} == {"act", "grad"}
    assert all(m["send"]["name"].split()[0] != m["recv"]["name"].split()[0] for m in crossed)
    assert "point-to-point message(s) reach a receive meant for another" in pp2.to_text()


def test_5240_creation_order_deadlocks_on_the_ring_of_pp4_vp2_only():
    res = simulate(load_program(examples_dir() / "e-comm-init-neighbor-first-pp4vp2.yaml")).to_json()
    assert res["deadlock"] is True and res["makespan_us"] == 0.0
    assert [(c["rank"], c["op"]) for c in res["cycle"]] == [
        (0, "comm_init of pp_0_1"), (1, "comm_init of pp_1_2"), (2, "comm_init of pp_2_3"), (3, "comm_init of pp_0_3")]
    assert res["explanation"][0].startswith("rank 0 main waits in comm_init of `pp_0_1` for rank 1 to create it too")
    # the same rule on a line of ranks (one chunk) or with one pair (PP 2) completes: no ring, no cycle
    assert not simulate(plan(4, "parity", schedule="1f1b", init="neighbors")).deadlock
    assert not simulate(plan(2, "parity", init="neighbors")).deadlock
    assert simulate(plan(8, "parity", init="neighbors")).deadlock
    fixed = simulate(load_program(examples_dir() / "e-comm-init-rank-order-pp4vp2.yaml")).to_json()
    assert fixed["deadlock"] is False and fixed["ops_executed"] == fixed["ops"]


def test_5240_lazy_creation_in_megatrons_own_order_is_consistent():
    """Created on first use in Megatron-LM's call order, the pair communicators come in one order on every rank
    (0-1, 1-2, 2-3, then 0-3: a chain, not a ring), so lazy creation alone cannot deadlock this plan; and
    batched calls create the group's communicator at every rank's first call."""
    for order in ("parity", "send-first", "batched"):
        prog = plan(4, order, init="lazy", eager=EAGER if order == "send-first" else 0)
        first = {r: [op.group for op in rp.streams["main"] if op.op == "comm_init"] for r, rp in prog.ranks.items()}
        if order == "batched":
            assert first == {r: ["pp"] for r in range(4)}
        else:
            assert first == {0: ["pp_0_1", "pp_0_3"], 1: ["pp_0_1", "pp_1_2"], 2: ["pp_1_2", "pp_2_3"],
                             3: ["pp_2_3", "pp_0_3"]}
    res = simulate(plan(4, "parity", init="lazy", eager=0))
    assert not res.deadlock


def test_generator_flag_errors(sim_cli):
    out = sim_cli("pipeline", "--p2p-order", "parity", "--tp", "2")
    assert out.returncode == 2 and "--p2p-order: models the pipeline ranks only: use --tp 1 --dp 1" in out.stderr
    out = sim_cli("pipeline", "--comm-init", "lazy")
    assert out.returncode == 2 and "--comm-init: needs --p2p-order" in out.stderr
    out = sim_cli("pipeline", "--p2p-order", "parity", "--streams", "1")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "drop --streams" in out.stderr
