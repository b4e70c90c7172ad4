"""The CLI shell, the one-line error contract, collective facts and the native trace format."""

import subprocess
import sys

import pytest

from distdoctor.collectives import REDUCING_OPS, SPECS, bus_factor, canonical_op, get_spec, reduces
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, dumps, loads


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "distdoctor", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_help_lists_every_subcommand(cli_env):
    out = run_cli("--help", env=cli_env)
    assert out.returncode == 0
    for name in ("check", "env", "validate", "bench", "diagnose", "run", "sim", "scaling", "parity"):
        assert f"  {name}" in out.stdout


def test_unknown_subcommand_is_one_line(cli_env):
    out = run_cli("no-such-thing", env=cli_env)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert "no-such-thing" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("n", [2, 4, 8])
def test_bus_factors_match_nccl_tests(n):
    assert bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for name in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        assert bus_factor(name, n) == pytest.approx((n - 1) / n)
    for name in ("broadcast", "reduce", "sendrecv"):
        assert bus_factor(name, n) == 1.0


def test_sizes_and_aliases():
    assert get_spec("all_gather").size_bytes(10, 4, 4) == 160  # nccl-tests: total gathered size
    assert get_spec("reduce_scatter").out_numel(40, 4) == 10
    assert canonical_op("nccl:_allgather_base") == "all_gather"
    assert canonical_op("gloo:all_reduce") == "all_reduce"
    assert canonical_op("nccl:send 0->1") == "send"
    assert canonical_op("nccl:recv 1<-0") == "recv"
    assert canonical_op("nccl:mystery") is None
    assert all(spec.name == name for name, spec in SPECS.items())


def test_reducing_ops_and_the_recorder_s_op_names_come_from_the_specs():
    from distdoctor.recorder.describe import DESCRIBERS

    assert REDUCING_OPS == {"all_reduce", "reduce", "reduce_scatter"}
    assert reduces("reduce_scatter_tensor") and not reduces("all_gather") and not reduces("no-such-op")
    # every torch.distributed function the recorder wraps is recorded as the spec that lists it among its aliases
    assert {name: canonical_op(name) for name in DESCRIBERS if canonical_op(name) is None} == {}
    assert canonical_op("all_gather_into_tensor") == "all_gather" and canonical_op("isend") == "send"


def test_native_trace_round_trip():
    trace = RankTrace(rank=1, source="native", world_size=2, groups={"0": GroupInfo("0", [0, 1])},
                      entries=[Entry(0, "0", "all_reduce", seq=1, state="completed",
                                     frames=[Frame("step", "train.py", 3)])],
                      stacks={"MainThread": [Frame("next", "loader.py", 9)]})
    back = loads(dumps(trace))
    assert back.entries == trace.entries and back.stacks == trace.stacks and back.groups == trace.groups


@pytest.mark.parametrize("text,reason", [("", "empty"), ("{", "not JSON"), ('{"a": 1}', "not a distdoctor trace")])
def test_native_trace_rejects_bad_text(text, reason):
    with pytest.raises(ValueError, match=reason):
        loads(text)
