"""Each kind of blocking (event, buffer, collective, p2p) in a hand-written program, with its exact cycle."""

import pytest

from distdoctor.sim.engine import collective_us, p2p_us
from distdoctor.sim.ir import Op


def test_event_cycle(sim_yaml):
    res = sim_yaml("""
        ranks:
          0:
            streams:
              s1: [{op: wait, event: e2}, {op: record, event: e1}]
              s2: [{op: wait, event: e1}, {op: record, event: e2}]
    """).to_json()
    assert res["deadlock"] is True
    assert res["cycle"] == [
        {"rank": 0, "stream": "s1", "op_index": 0, "op": "wait e2",
         "waits_for": [{"rank": 0, "stream": "s2", "op_index": 1, "op": "record e2", "via": "event e2"}]},
        {"rank": 0, "stream": "s2", "op_index": 0, "op": "wait e1",
         "waits_for": [{"rank": 0, "stream": "s1", "op_index": 1, "op": "record e1", "via": "event e1"}]},
    ]
    assert res["blocked"] == [{"rank": 0, "stream": "s1", "op_index": 0, "op": "wait e2"},
                              {"rank": 0, "stream": "s2", "op_index": 0, "op": "wait e1"}]
    assert res["makespan_us"] == 0


def test_buffer_cycle(sim_yaml):
    res = sim_yaml("""
        ranks:
          0:
            buffers: {act: 1}
            streams:
              fwd: [{op: acquire, buffer: act}, {op: compute, us: 10, name: f0}, {op: wait, event: grad0},
                    {op: release, buffer: act}]
              bwd: [{op: acquire, buffer: act}, {op: record, event: grad0}, {op: release, buffer: act}]
    """)
    out = res.to_json()
    assert out["deadlock"] is True
    assert out["cycle"] == [
        {"rank": 0, "stream": "fwd", "op_index": 2, "op": "wait grad0",
         "waits_for": [{"rank": 0, "stream": "bwd", "op_index": 1, "op": "record grad0", "via": "event grad0"}]},
        {"rank": 0, "stream": "bwd", "op_index": 0, "op": "acquire act",
         "waits_for": [{"rank": 0, "stream": "fwd", "op_index": 3, "op": "release act", "via": "buffer act"}]},
    ]
    assert out["buffers"] == {"0/act": {"capacity": 1, "peak": 1}}
    assert out["streams"]["0/fwd"] == {"busy_us": 10.0, "wait_us": 0.0, "idle_us": 0.0}
    assert out["streams"]["0/bwd"] == {"busy_us": 0.0, "wait_us": 10.0, "idle_us": 0.0}
    assert out["explanation"][0].startswith("rank 0 fwd waits for event `grad0` (op 2 `wait grad0`), recorded only "
                                            "by rank 0 bwd at op 1")
    assert "waits for a free `act` slot, released only by rank 0 fwd at op 3" in out["explanation"][0]


def test_collective_cycle(sim_yaml):
    res = sim_yaml("""
        groups: {g1: [0, 1], g2: [0, 1]}
        ranks:
          0: {streams: {main: [{op: collective, group: g1, kind: all_reduce, bytes: 64},
                               {op: collective, group: g2, kind: all_reduce, bytes: 64}]}}
          1: {streams: {main: [{op: collective, group: g2, kind: all_reduce, bytes: 64},
                               {op: collective, group: g1, kind: all_reduce, bytes: 64}]}}
    """).to_json()
    assert res["deadlock"] is True
    assert res["cycle"] == [
        {"rank": 0, "stream": "main", "op_index": 0, "op": "all_reduce on g1",
         "waits_for": [{"rank": 1, "stream": "main", "op_index": 1, "op": "all_reduce on g1",
                        "via": "collective g1 #1"}]},
        {"rank": 1, "stream": "main", "op_index": 0, "op": "all_reduce on g2",
         "waits_for": [{"rank": 0, "stream": "main", "op_index": 1, "op": "all_reduce on g2",
                        "via": "collective g2 #1"}]},
    ]


def test_p2p_cycle_both_receive_first(sim_yaml):
    res = sim_yaml("""
        ranks:
          0: {streams: {main: [{op: recv, peer: 1, bytes: 8}, {op: send, peer: 1, bytes: 8}]}}
          1: {streams: {main: [{op: recv, peer: 0, bytes: 8}, {op: send, peer: 0, bytes: 8}]}}
    """).to_json()
    assert res["cycle"] == [
        {"rank": 0, "stream": "main", "op_index": 0, "op": "recv from 1",
         "waits_for": [{"rank": 1, "stream": "main", "op_index": 1, "op": "send to 0", "via": "p2p 1->0"}]},
        {"rank": 1, "stream": "main", "op_index": 0, "op": "recv from 0",
         "waits_for": [{"rank": 0, "stream": "main", "op_index": 1, "op": "send to 1", "via": "p2p 0->1"}]},
    ]


def test_p2p_send_first_on_one_side_runs(sim_yaml):
    res = sim_yaml("""
        cost: {alpha_us: 2, gbps: 1}
        ranks:
          0: {streams: {main: [{op: send, peer: 1, bytes: 1000}, {op: recv, peer: 1, bytes: 1000}]}}
          1: {streams: {main: [{op: recv, peer: 0, bytes: 1000}, {op: send, peer: 0, bytes: 1000}]}}
    """).to_json()
    assert res["deadlock"] is False and res["cycle"] == [] and res["blocked"] == []
    assert res["makespan_us"] == pytest.approx(2 * (2 + 1000 / 1e3))


def test_cross_rank_cycle_through_buffer_event_and_collective(sim_yaml):
    # rank 0 holds its only slot while waiting in an all-reduce; rank 1 reaches that all-reduce only after an
    # event that its other stream records after a p2p receive from rank 0, which rank 0 sends after the release.
    res = sim_yaml("""
        groups: {tp: [0, 1]}
        ranks:
          0:
            buffers: {act: 1}
            streams:
              fwd: [{op: acquire, buffer: act}, {op: collective, group: tp, kind: all_reduce, us: 5},
                    {op: release, buffer: act}, {op: send, peer: 1, us: 1}]
          1:
            streams:
              main: [{op: wait, event: ready}, {op: collective, group: tp, kind: all_reduce, us: 5}]
              comm: [{op: recv, peer: 0, us: 1}, {op: record, event: ready}]
    """).to_json()
    assert [(c["rank"], c["stream"], c["op_index"]) for c in res["cycle"]] == [(0, "fwd", 1), (1, "main", 0),
                                                                               (1, "comm", 0)]
    assert [c["waits_for"][0]["via"] for c in res["cycle"]] == ["collective tp #1", "event ready", "p2p 0->1"]


def test_missing_release_is_starvation_not_a_cycle(sim_yaml):
    res = sim_yaml("""
        ranks:
          0:
            buffers: {act: 1}
            streams:
              fwd: [{op: acquire, buffer: act}, {op: compute, us: 3}, {op: acquire, buffer: act}]
              bwd: [{op: acquire, buffer: act}, {op: release, buffer: act}]
    """).to_json()
    assert res["deadlock"] is True and res["cycle"] == []
    assert res["blocked"] == [{"rank": 0, "stream": "fwd", "op_index": 2, "op": "acquire act"},
                              {"rank": 0, "stream": "bwd", "op_index": 0, "op": "acquire act"}]
    # fwd holds the slot and waits for bwd's release; bwd can only release after its own acquire: the root.
    assert res["explanation"] == [
        "rank 0 bwd waits for a free `act` slot (op 0 `acquire act`), but only rank 0 bwd itself releases `act` "
        "again, at op 1, behind this op."]


def test_acquire_without_any_release(sim_yaml):
    res = sim_yaml("""
        ranks:
          0:
            buffers: {act: 1}
            streams:
              fwd: [{op: acquire, buffer: act}, {op: compute, us: 3}, {op: acquire, buffer: act}]
    """).to_json()
    assert res["explanation"] == ["rank 0 fwd waits for a free `act` slot (op 2 `acquire act`), but no stream of "
                                  "rank 0 releases `act` any more."]


def test_rank_that_never_issues_its_collective(sim_yaml):
    res = sim_yaml("""
        groups: {dp: [0, 1, 2]}
        ranks:
          0: {streams: {s: [{op: collective, group: dp, kind: all_reduce, us: 1},
                            {op: collective, group: dp, kind: all_reduce, us: 1}]}}
          1: {streams: {s: [{op: collective, group: dp, kind: all_reduce, us: 1},
                            {op: collective, group: dp, kind: all_reduce, us: 1}]}}
          2: {streams: {s: [{op: collective, group: dp, kind: all_reduce, us: 1}]}}
    """).to_json()
    assert res["deadlock"] is True and res["cycle"] == []
    assert "rank 2 never issues collective #2 on `dp`" in res["explanation"][0]
    assert res["streams"]["2/s"] == {"busy_us": 1.0, "wait_us": 0.0, "idle_us": 0.0}


def test_collective_start_waits_for_last_member_and_holds_all(sim_yaml):
    res = sim_yaml("""
        groups: {g: [0, 1]}
        ranks:
          0: {streams: {s: [{op: compute, us: 10}, {op: collective, group: g, kind: all_gather, us: 4}]}}
          1: {streams: {s: [{op: compute, us: 30}, {op: collective, group: g, kind: all_gather, us: 4}]}}
    """).to_json()
    assert res["makespan_us"] == 34
    assert res["streams"]["0/s"] == {"busy_us": 14.0, "wait_us": 20.0, "idle_us": 0.0}
    assert res["streams"]["1/s"] == {"busy_us": 34.0, "wait_us": 0.0, "idle_us": 0.0}
    assert res["bubble_fraction"] == pytest.approx((20 / 34) / 2, abs=1e-6)


def test_cost_model_uses_collective_bus_factors():
    op = Op("collective", kind="all_reduce", bytes=1 << 20, group="g")
    assert collective_us(op, 4, alpha_us=5, gbps=100) == pytest.approx(5 + (1 << 20) * 1.5 / 1e5)
    ag = Op("collective", kind="all_gather", bytes=1 << 20, group="g")
    assert collective_us(ag, 8, alpha_us=0, gbps=10) == pytest.approx((1 << 20) * 7 / 8 / 1e4)
    assert collective_us(Op("collective", us=7.0, kind="all_reduce", group="g"), 4, 5, 100) == 7.0
    assert p2p_us(Op("send", bytes=2000, peer=1), alpha_us=1, gbps=2) == pytest.approx(2.0)


RACE = """
    ranks:
      0:
        buffers: {b: 1}
        streams:
          s1: [{op: compute, us: 12}, {op: acquire, buffer: b}, {op: wait, event: e2}, {op: release, buffer: b}]
          s2: [{op: compute, us: 10}, {op: acquire, buffer: b}, {op: release, buffer: b}, {op: record, event: e2}]
"""


def test_timing_trials_find_a_deadlock_the_nominal_timing_misses(sim_yaml):
    # Nominal: s2 takes the slot first and all is well. If s1's compute ends first it holds the slot while
    # waiting for e2, which s2 records only after its own acquire: a race only other timings reveal.
    assert sim_yaml(RACE).to_json()["deadlock"] is False
    from distdoctor.sim.ir import parse_text
    from distdoctor.sim.result import simulate

    import textwrap

    res = simulate(parse_text(textwrap.dedent(RACE), "race.yaml"), trials=40, jitter=0.3, seed=0)
    out = res.to_json()
    assert out["deadlock"] is True
    assert out["timing"]["deadlocked_trials"] > 0 and out["timing"]["shown"].startswith("trial ")
    assert [(c["stream"], c["op"]) for c in out["cycle"]] == [("s1", "wait e2"), ("s2", "acquire b")]
    text = res.to_text().splitlines()
    assert text[0].startswith("DEADLOCK") and text[1].startswith("  Timing: the nominal timing runs, but")
    # and without jitter no trial can differ from the nominal run
    calm = simulate(parse_text(textwrap.dedent(RACE), "race.yaml"), trials=5, jitter=0.0).to_json()
    assert calm["deadlock"] is False and calm["timing"]["deadlocked_trials"] == 0
