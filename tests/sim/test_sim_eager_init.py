"""Two IR extensions: eager (buffered) point-to-point and communicator creation (`comm_init`)."""

import pytest

from distdoctor.errors import InputError
from distdoctor.sim.ir import dump_program, load_program, parse_text

EXCHANGE = """
{eager}
ranks:
  0: {{streams: {{main: [{{op: send, peer: 1, bytes: {n}, us: 10}}, {{op: recv, peer: 1, bytes: {n}, us: 10}}]}}}}
  1: {{streams: {{main: [{{op: send, peer: 0, bytes: {n}, us: 10}}, {{op: recv, peer: 0, bytes: {n}, us: 10}}]}}}}
"""


def test_send_first_exchange_deadlocks_unless_the_message_fits_the_eager_buffer(sim_yaml):
    rendezvous = sim_yaml(EXCHANGE.format(eager="", n=100)).to_json()
    assert rendezvous["deadlock"] is True
    assert [c["op"] for c in rendezvous["cycle"]] == ["send to 1", "send to 0"]
    fits = sim_yaml(EXCHANGE.format(eager="p2p: {eager_bytes: 100}", n=100)).to_json()
    assert fits["deadlock"] is False and fits["makespan_us"] == 10.0
    too_big = sim_yaml(EXCHANGE.format(eager="p2p: {eager_bytes: 100}", n=101)).to_json()
    assert too_big["deadlock"] is True


def test_eager_buffer_is_shared_by_the_messages_of_a_channel(sim_yaml):
    # Rank 0 sends two 60-byte messages through a 100-byte buffer: the second waits until rank 1, busy for
    # 100 us, takes the first; then it completes without its own receive (posted only later).
    out = sim_yaml("""
        p2p: {eager_bytes: 100}
        ranks:
          0: {streams: {main: [{op: send, peer: 1, bytes: 60, us: 10}, {op: send, peer: 1, bytes: 60, us: 10},
                               {op: compute, us: 1, name: after}]}}
          1: {streams: {main: [{op: compute, us: 100}, {op: recv, peer: 0, bytes: 60, us: 10},
                               {op: compute, us: 50}, {op: recv, peer: 0, bytes: 60, us: 10}]}}
    """, detail=True)
    res = out.to_json()
    assert res["deadlock"] is False
    # first send 0-10, second parked 10-100, then its transfer 100-110, then `after` 110-111
    assert res["streams"]["0/main"] == {"busy_us": 21.0, "wait_us": 90.0, "idle_us": 39.0}
    # rank 1: compute to 100, first recv takes the buffered message at once (its data arrived at 10), compute to
    # 150, the second message is there since 110
    assert res["makespan_us"] == 150.0
    log = out.state.comm_log
    assert [rec[3:] for rec in log[0]] == [[0.0, 10.0], [100.0, 110.0]]
    assert [rec[3:] for rec in log[1]] == [[100.0, 100.0], [150.0, 150.0]]


def test_eager_bytes_round_trip_and_validation(tmp_path):
    prog = parse_text(EXCHANGE.format(eager="p2p: {eager_bytes: 4096}", n=1), "x.yaml")
    assert prog.eager_bytes == 4096
    dump_program(prog, tmp_path / "x.yaml")
    assert "eager_bytes: 4096" in (tmp_path / "x.yaml").read_text()
    assert load_program(tmp_path / "x.yaml").eager_bytes == 4096
    with pytest.raises(InputError, match="p2p.eager_bytes: must not be negative"):
        parse_text(EXCHANGE.format(eager="p2p: {eager_bytes: -1}", n=1), "x.yaml")
    with pytest.raises(InputError, match="p2p.window: unknown field"):
        parse_text(EXCHANGE.format(eager="p2p: {window: 1}", n=1), "x.yaml")


CREATE = """
groups: {p01: [0, 1], p12: [1, 2], p02: [0, 2]}
ranks:
  0: {streams: {main: [{op: comm_init, group: %s}, {op: comm_init, group: %s}]}}
  1: {streams: {main: [{op: comm_init, group: %s}, {op: comm_init, group: %s}]}}
  2: {streams: {main: [{op: comm_init, group: %s}, {op: comm_init, group: %s}]}}
"""


def test_communicators_created_in_a_rotating_order_deadlock(sim_yaml):
    res = sim_yaml(CREATE % ("p01", "p02", "p12", "p01", "p02", "p12"), name="init.yaml")
    out = res.to_json()
    assert out["deadlock"] is True
    assert [(c["rank"], c["op"]) for c in out["cycle"]] == [(0, "comm_init of p01"), (1, "comm_init of p12"),
                                                           (2, "comm_init of p02")]
    assert out["cycle"][0]["waits_for"][0]["via"] == "comm_init p01"
    assert out["explanation"][0].startswith(
        "rank 0 main waits in comm_init of `p01` for rank 1 to create it too (op 0 `comm_init of p01`), which "
        "rank 1 main calls only at op 1 (`comm_init of p01`)")
    assert out["explanation"][0].endswith("the cycle closes, no stream on it can move.")


def test_communicators_created_in_one_global_order_do_not(sim_yaml):
    out = sim_yaml(CREATE % ("p01", "p02", "p01", "p12", "p02", "p12")).to_json()
    assert out["deadlock"] is False and out["makespan_us"] == 15.0  # three creations of alpha = 5 us in a chain


def test_a_member_that_never_creates_the_communicator_is_named(sim_yaml):
    out = sim_yaml("""
        groups: {p01: [0, 1]}
        ranks:
          0: {streams: {main: [{op: comm_init, group: p01, us: 100}]}}
          1: {streams: {main: [{op: compute, us: 1}]}}
    """).to_json()
    assert out["deadlock"] is True and out["cycle"] == []
    assert out["explanation"] == ["rank 0 main waits in comm_init of `p01` (op 0 `comm_init of p01`), but rank 1 "
                                  "never creates communicator `p01`."]


@pytest.mark.parametrize("streams,message", [
    ("[{op: comm_init, group: p01}, {op: comm_init, group: p01}]",
     "rank 0 stream main op 1: creates communicator 'p01' a second time (first at stream main op 0)"),
    ("[{op: collective, group: p01, kind: barrier}, {op: comm_init, group: p01}]",
     "rank 0 stream main op 1: creates communicator 'p01' after op 0 of the same stream already used it"),
    ("[{op: comm_init, group: nope}]", "rank 0 stream main op 0: unknown group 'nope'"),
    ("[{op: comm_init, group: p01, bytes: 4}]", "rank 0 stream main op 0: bytes: unknown field"),
])
def test_comm_init_validation(streams, message):
    text = f"groups: {{p01: [0, 1]}}\nranks:\n  0: {{streams: {{main: {streams}}}}}\n  1: {{streams: {{main: []}}}}\n"
    with pytest.raises(InputError) as err:
        parse_text(text, "plan.yaml")
    assert str(err.value).startswith(f"plan.yaml: {message}")


def test_comm_init_stays_out_of_traces_but_shows_in_stacks(sim_yaml):
    from distdoctor.sim.emit import to_rank_traces

    res = sim_yaml(CREATE % ("p01", "p02", "p12", "p01", "p02", "p12"), detail=True)
    traces = to_rank_traces(res)
    assert all(t.entries == [] for t in traces)
    assert traces[0].stacks["main"][-1].name == "comm_init of p01 (waiting for ranks 1)"
