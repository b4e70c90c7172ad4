"""The overhead benchmark runs end to end (its figures go to docs/benchmarks.md; nothing is timed here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from recorder_helpers import kill_group

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "recorder_overhead.py"


@pytest.mark.slow
def test_overhead_benchmark_runs(cli_env):
    proc = subprocess.Popen([sys.executable, str(BENCH), "--quick", "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail("benchmark did not finish in 240 s")
    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    assert result["rounds"] == 2
    for key in ("all_reduce_wall_us_off", "all_reduce_wall_us_on", "recording_alone_cpu_us", "ddp_step_wall_ms_off",
                "ddp_step_cpu_ms_on"):
        assert result[key] > 0, key
    assert "added_cpu_us_per_call" in result and "ddp_wall_overhead_pct" in result
