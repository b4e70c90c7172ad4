"""distdoctor parity on real gloo ranks: exact-tolerance agreement with one process, and a drift it must catch."""

import json
import sys

import pytest

pytestmark = pytest.mark.slow


def test_parity_passes_with_tight_float64_tolerance(run):
    res = run([sys.executable, "-m", "distdoctor", "parity", "--nproc", "2", "--steps", "3", "--format", "json"])
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["passed"] and doc["world_size"] == 2 and doc["global_batch"] == 32
    runs = {r["mode"]: r for r in doc["runs"]}
    assert set(runs) == {"ddp", "ddp_grad_accum", "ddp_no_sync", "data_parallel"}
    for mode in ("ddp", "ddp_grad_accum", "ddp_no_sync"):
        r = runs[mode]
        assert r["status"] == "pass" and r["ranks_identical"]
        # float64 rounding of a different summation order: ~1e-17, far inside the tolerance
        assert r["max_abs_diff"] < 1e-14
        assert [p["name"] for p in r["params"]] == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert runs["data_parallel"]["status"] == "skipped" and "GPUs" in runs["data_parallel"]["reason"]


def test_parity_fails_on_drift_and_names_rank(run):
    res = run([sys.executable, "-m", "distdoctor", "parity", "--nproc", "2", "--steps", "2", "--inject", "drift:1:1e-9",
               "--format", "json"])
    assert res.returncode == 1, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert not doc["passed"]
    for r in doc["runs"][:3]:
        assert r["status"] == "fail" and not r["ranks_identical"] and r["worst_rank"] == 1
        worst = max(r["params"], key=lambda p: p["max_abs_diff"])
        assert worst["name"] == "0.weight" and worst["max_abs_diff"] == pytest.approx(1e-9, rel=1e-3)


@pytest.mark.parametrize("args, message", [
    (["--nproc", "2", "--batch", "6"], "--batch: 6 does not split into 2 ranks x 2 micro-batches"),
    (["--nproc", "2", "--inject", "drift:2"], "--inject drift:2: rank 2 does not exist in a world of 2"),
])
def test_parity_bad_input_is_one_line(run, args, message):
    res = run([sys.executable, "-m", "distdoctor", "parity", *args], timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [f"distdoctor parity: error: {message}"]
