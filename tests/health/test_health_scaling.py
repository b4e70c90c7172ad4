"""distdoctor scaling on 1 and 2 gloo ranks: sane numbers (not timings), projected points kept apart, the plot."""

import json
import sys

import pytest

from distdoctor.health.projection import allreduce_us, fit_alpha_beta, project


def test_alpha_beta_fit_recovers_model():
    # synthetic rows from t = 2(n-1)*alpha + S*bf/B with alpha 20 us, B 2 GB/s, n = 4 (bf = 1.5)
    rows = [{"op": "all_reduce", "size_bytes": s, "time_us": 6 * 20 + s * 1.5 / 2e3} for s in (4096, 65536, 2**20, 2**24)]
    fit = fit_alpha_beta(rows, 4)
    assert fit["alpha_us"] == pytest.approx(20) and fit["busbw_gbps"] == pytest.approx(2.0) and fit["r2"] == pytest.approx(1)
    assert allreduce_us(fit, 8, 2**20) == pytest.approx(14 * 20 + 2**20 * 1.75 / 2e3)
    assert allreduce_us(fit, 1, 2**20) == 0


def test_projection_marks_points_and_bounds_efficiency():
    fit = {"alpha_us": 10.0, "busbw_gbps": 1.0}
    measured = [
        {"world_size": 1, "mode": "weak", "per_rank_batch": 32, "global_batch": 32, "samples_per_s": 3200.0,
         "compute_ms": 10.0, "exposed_allreduce_ms": 0.0},
        {"world_size": 2, "mode": "weak", "per_rank_batch": 32, "global_batch": 64, "samples_per_s": 5000.0,
         "compute_ms": 10.0, "exposed_allreduce_ms": 2.8},
    ]
    pts = project(measured, fit, 2**20, [4, 8, 1024])
    assert [p["world_size"] for p in pts] == [4, 8, 1024] and all(p["projected"] for p in pts)
    effs = [p["efficiency"] for p in pts]
    assert all(0 < e <= 1 for e in effs) and effs == sorted(effs, reverse=True)
    # 1024 ranks: all-reduce ~ 2*1023*10 us + 2 MiB at 1 GB/s, minus what backward hid at 2 ranks
    assert pts[-1]["allreduce_ms"] == pytest.approx((2 * 1023 * 10 + 2**20 * 2 * 1023 / 1024 / 1e3) / 1e3)


@pytest.mark.slow
def test_scaling_command_on_one_and_two_ranks(run, tmp_path):
    png = tmp_path / "scaling.png"
    res = run([sys.executable, "-m", "distdoctor", "scaling", "--max-ranks", "2", "--hidden", "128", "--layers", "3",
               "--steps", "4", "--warmup", "1", "--format", "json", "--png", str(png)], timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["world_sizes"] == [1, 2] and doc["errors"] == []
    assert doc["model"]["grad_bytes"] == 3 * (128 * 128 + 128) * 4
    measured = {(p["world_size"], p["mode"]): p for p in doc["measured"]}
    assert set(measured) == {(1, "weak"), (1, "strong"), (2, "weak"), (2, "strong")}
    assert not any(p["projected"] for p in doc["measured"]) and all(p["projected"] for p in doc["projected"])
    for (n, mode), p in measured.items():
        assert p["samples_per_s"] > 0 and 0 < p["compute_ms"] <= p["step_ms"]
        assert 0 <= p["exposed_allreduce_share"] < 1
        assert p["global_batch"] == (32 * n if mode == "weak" else 64)
    assert measured[(1, "weak")]["efficiency"] == 1 and measured[(1, "weak")]["exposed_allreduce_share"] == 0
    for (n, mode), p in measured.items():  # the documented ratio of the measured throughputs (its value is the
        # machine's: on a loaded 2-core box two ranks can even seem superlinear, so no bound is asserted on it)
        assert p["efficiency"] == pytest.approx(p["samples_per_s"] / (n * measured[(1, mode)]["samples_per_s"]))
    assert [p["world_size"] for p in doc["projected"] if p["mode"] == "weak"] == [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    assert max(p["world_size"] for p in doc["projected"] if p["mode"] == "strong") == 64  # one sample per rank
    ab = doc["alpha_beta"]
    assert ab["fit_world_size"] == 2 and ab["alpha_us"] >= 0 and ab["busbw_gbps"] > 0
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_scaling_rejects_nproc(run):
    res = run([sys.executable, "-m", "distdoctor", "scaling", "--nproc", "2"], timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip() == "distdoctor scaling: error: --nproc: scaling chooses the world sizes itself; use --max-ranks"
