"""bench CLI on a real gloo world: the nccl-tests table and --min-busbw."""

import pytest

from vb_helpers import run_cli

pytestmark = pytest.mark.slow


def test_bench_cli_table_and_min_busbw():
    code, out, err = run_cli("bench", "--nproc", 2, "-b", "4K", "-e", "64K", "-f", 4, "-n", 3, "-w", 1,
                             "--min-busbw", 1e6, timeout=300)
    assert code == 1, err[-3000:]  # nobody has a petabyte per second: --min-busbw fails the run
    lines = out.splitlines()
    data = [l for l in lines if l and not l.startswith("#")]
    assert [int(l.split()[0]) for l in data] == [4096, 16384, 65536]
    assert all(l.split()[2:5] == ["float", "sum", "-1"] and l.split()[-1] == "0" for l in data)
    assert any(l.startswith("# Avg bus bandwidth    : ") for l in lines)
    assert lines[-1].startswith("# FAIL: average bus bandwidth")


