"""The shipped incident examples and their fixed twins: verdicts, cycles and the waiting they show."""

import json

import pytest

from distdoctor.sim.command import examples_dir
from distdoctor.sim.ir import load_program
from distdoctor.sim.plans.fsdp import FsdpConfig, build_fsdp
from distdoctor.sim.plans.pipeline import PipelineConfig, build_pipeline
from distdoctor.sim.result import simulate

VERDICTS = {
    "a-pipeline-grad-buffer-on-fwd-stream": True,
    "a-pipeline-grad-buffer-on-bwd-stream": False,
    "b-hsdp-shared-unshard-stream": False,
    "b-hsdp-per-group-unshard-streams": False,
    "c-groups-out-of-order": True,
    "c-groups-same-order": False,
    "d-megatron-p2p-fixed-order-pp4": True,
    "d-megatron-p2p-parity-order-pp4": False,
    "e-comm-init-neighbor-first-pp4vp2": True,
    "e-comm-init-rank-order-pp4vp2": False,
}


def run_example(name: str, detail: bool = False):
    return simulate(load_program(examples_dir() / f"{name}.yaml"), detail=detail)


def test_every_shipped_example_has_an_expected_verdict():
    assert {p.stem for p in examples_dir().glob("*.yaml")} == set(VERDICTS)


@pytest.mark.parametrize("name,deadlock", sorted(VERDICTS.items()))
def test_example_verdict(name, deadlock):
    out = run_example(name).to_json()
    assert out["deadlock"] is deadlock
    assert (out["ops_executed"] == out["ops"]) is not deadlock


def test_a_cycle_is_the_forward_stream_holding_the_slot_the_backward_needs():
    res = run_example("a-pipeline-grad-buffer-on-fwd-stream")
    out = res.to_json()
    assert [(c["rank"], c["stream"], c["op"]) for c in out["cycle"]] == [(0, "fwd", "acquire act"),
                                                                         (0, "bwd", "wait grad_in0")]
    assert out["cycle"][0]["waits_for"][0] == {"rank": 0, "stream": "bwd", "op_index": 4, "op": "release act",
                                               "via": "buffer act"}
    assert out["cycle"][1]["waits_for"][0] == {"rank": 0, "stream": "fwd", "op_index": 11,
                                               "op": "record grad_in0", "via": "event grad_in0"}
    # all 8 ranks of the 2x2x2 job end up stuck, as in the incident: the same cycle on each stage-0 rank,
    # and stage 1 waiting for them
    assert len({b["rank"] for b in out["blocked"]}) == 8
    assert out["other_cycles_count"] == 3
    assert [[(x["rank"], x["stream"], x["op"]) for x in cyc] for cyc in out["other_cycles"]] == [
        [(r, "fwd", "acquire act"), (r, "bwd", "wait grad_in0")] for r in (1, 2, 3)]
    text = res.to_text()
    assert text.startswith("DEADLOCK")
    assert "rank 0 fwd waits for a free `act` slot" in text and "released only by rank 0 bwd" in text


def test_a_examples_are_what_the_generator_emits():
    for stream, name in (("fwd", "a-pipeline-grad-buffer-on-fwd-stream"), ("bwd", "a-pipeline-grad-buffer-on-bwd-stream")):
        gen = build_pipeline(PipelineConfig(stages=2, microbatches=4, dp=2, tp=2, act_buffer=1,
                                            grad_recv_stream=stream))
        shipped = load_program(examples_dir() / f"{name}.yaml")
        assert gen.ranks == shipped.ranks and gen.groups == shipped.groups


def _collective_order(res, kind):
    """Per rank and group, the names of its collectives of one kind in the order the rank issued them."""
    rs = res.state
    order = {}
    for sid, (r, s) in enumerate(rs.compiled.streams):
        for idx, seq, t_issue, *_ in rs.comm_log[sid]:
            op = res.program.ranks[r].streams[s][idx]
            if op.kind == kind:
                order.setdefault((r, op.group), []).append((seq, op.name))
    return {k: [name for _, name in sorted(v)] for k, v in order.items()}


def test_b_per_group_streams_same_collectives_less_compute_waiting():
    shared = run_example("b-hsdp-shared-unshard-stream", detail=True)
    per_group = run_example("b-hsdp-per-group-unshard-streams", detail=True)
    # Same result: the same all-gathers and reduce-scatters in the same order on every group, and every
    # collective instance is the same op on all its members.
    for kind in ("all_gather", "reduce_scatter"):
        assert _collective_order(shared, kind) == _collective_order(per_group, kind)
    a, b = shared.to_json(), per_group.to_json()
    assert a["mismatches"] == [] and b["mismatches"] == []
    wait_shared = sum(v["wait_us"] for k, v in a["streams"].items() if k.endswith("/compute"))
    wait_per_group = sum(v["wait_us"] for k, v in b["streams"].items() if k.endswith("/compute"))
    busy = {k: v["busy_us"] for k, v in a["streams"].items() if k.endswith("/compute")}
    assert busy == {k: v["busy_us"] for k, v in b["streams"].items() if k.endswith("/compute")}
    assert wait_per_group < wait_shared
    assert b["makespan_us"] < a["makespan_us"] and b["bubble_fraction"] < a["bubble_fraction"]


def test_b_examples_are_what_the_generator_emits():
    for mode, name in (("shared", "b-hsdp-shared-unshard-stream"), ("per-group", "b-hsdp-per-group-unshard-streams")):
        gen = build_fsdp(FsdpConfig(ranks=8, shard_group=4, units=8, prefetch=2, unshard_streams=mode,
                                    compute_us=100, ag_us_global=400, ag_us_local=50))
        assert gen.ranks == load_program(examples_dir() / f"{name}.yaml").ranks


def test_fsdp_shared_stream_waits_for_prefetched_global_all_gather():
    # Prefetch 1: the local unit 1 waits for the global all-gather of unit 2 only on a shared stream.
    kw = dict(ranks=4, shard_group=2, units=4, prefetch=1, compute_us=100, ag_us_global=500, ag_us_local=10,
              backward=False)
    shared = simulate(build_fsdp(FsdpConfig(unshard_streams="shared", **kw))).to_json()
    per_group = simulate(build_fsdp(FsdpConfig(unshard_streams="per-group", **kw))).to_json()
    assert shared["streams"]["0/compute"]["wait_us"] > per_group["streams"]["0/compute"]["wait_us"]
    assert not shared["deadlock"] and not per_group["deadlock"]


def test_c_cycle_crosses_both_groups():
    out = run_example("c-groups-out-of-order").to_json()
    assert out["cycle"] == [
        {"rank": 0, "stream": "compute", "op_index": 1, "op": "reduce_scatter on foo_pg (rs_foo)",
         "waits_for": [{"rank": 2, "stream": "compute", "op_index": 3, "op": "reduce_scatter on foo_pg (rs_foo)",
                        "via": "collective foo_pg #1"},
                       {"rank": 3, "stream": "compute", "op_index": 3, "op": "reduce_scatter on foo_pg (rs_foo)",
                        "via": "collective foo_pg #1"}]},
        {"rank": 2, "stream": "compute", "op_index": 1, "op": "reduce_scatter on bar_pg (rs_bar)",
         "waits_for": [{"rank": 0, "stream": "compute", "op_index": 3, "op": "reduce_scatter on bar_pg (rs_bar)",
                        "via": "collective bar_pg #1"},
                       {"rank": 1, "stream": "compute", "op_index": 3, "op": "reduce_scatter on bar_pg (rs_bar)",
                        "via": "collective bar_pg #1"}]},
    ]
    assert len(out["blocked"]) == 4


def test_cli_exit_codes_and_json_contract(sim_cli, tmp_path):
    dead = sim_cli("run", "c-groups-out-of-order", "--format", "json", "--emit-trace", tmp_path / "tr",
                   "--chrome-trace", tmp_path / "c.json", "--png", tmp_path / "c.png")
    assert dead.returncode == 1, dead.stderr
    out = json.loads(dead.stdout)
    assert {"deadlock", "cycle", "blocked", "makespan_us", "streams", "bubble_fraction"} <= set(out)
    assert set(out["streams"]["0/compute"]) == {"busy_us", "wait_us", "idle_us"}
    assert set(out["cycle"][0]) == {"rank", "stream", "op_index", "op", "waits_for"}
    assert set(out["blocked"][0]) == {"rank", "stream", "op_index", "op"}
    assert sorted(p.name for p in (tmp_path / "tr").iterdir()) == [f"rank_{r}.jsonl" for r in range(4)]
    trace = json.loads((tmp_path / "c.json").read_text())
    assert any(e.get("args", {}).get("blocked") for e in trace["traceEvents"])
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    ok = sim_cli("run", examples_dir() / "c-groups-same-order.yaml", "--trials", "3")
    assert ok.returncode == 0 and ok.stdout.startswith("No deadlock")
    assert "Timing: the nominal run and 3 trials" in ok.stdout
