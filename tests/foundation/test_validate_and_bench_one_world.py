"""validate (every op, 2 ranks) and bench (every op) in ONE real gloo world, through the worker API `check` uses."""

import pytest

from distdoctor.bench.sweep import BENCH_OPS, BenchOptions, summarize_bench
from distdoctor.collectives import SPECS
from distdoctor.collectives.base import REDOPS
from distdoctor.validate.sweep import ValidateOptions, summarize_validate
from distdoctor.world import WorldConfig, run_job
from vb_helpers import no_leftover_workers

pytestmark = pytest.mark.slow
ROW_FIELDS = {"op", "dtype", "count", "group", "inplace", "max_abs_err", "ranks_agree", "status", "reason"}


@pytest.fixture(scope="module")
def world():
    vopts = ValidateOptions(sizes="0,7,1000", dtypes=("float32", "float64", "float16", "bfloat16", "int32",
                                                                 "int64"))
    bench = {"dtype": "float32", "redop": "sum", "root": 1, "sizes": [1024, 8192], "iters": 2, "warmup": 1,
             "check": True, "seed": 0}
    job = run_job("vb_jobs:validate_then_bench", {"validate": vopts.worker_args(), "bench_ops": list(BENCH_OPS),
                                                  "bench": bench}, WorldConfig(nproc=2, timeout_s=60))
    assert job.ok, (job.lost, job.errors)
    return job, vopts


def test_validate_two_ranks_every_op_passes(world):
    job, vopts = world
    rep = summarize_validate(job, vopts)
    assert rep["passed"] is True and rep["world_size"] == 2 and rep["backend"] == "gloo"
    rows = rep["results"]
    assert all(ROW_FIELDS <= set(r) for r in rows)
    assert {r["op"] for r in rows} == set(SPECS)
    assert {r["dtype"] for r in rows if r["op"] != "barrier"} == {"float32", "float64", "float16", "bfloat16",
                                                                         "int32", "int64"}
    assert {r["count"] for r in rows if r["op"] == "all_reduce"} == {0, 7, 1000}
    assert {r["redop"] for r in rows if r["op"] == "all_reduce"} == set(REDOPS)
    assert {(r["form"], r["inplace"]) for r in rows if r["op"] == "all_gather"} == \
        {("list", False), ("tensor", False), ("tensor", True)}
    assert {r["form"] for r in rows if r["op"] == "all_to_all"} == {"even", "uneven"}
    for r in rows:
        assert r["status"] in ("pass", "skipped"), r
        if r["status"] == "skipped":  # gloo cannot average integers: said so, never passed
            assert r["redop"] == "avg" and r["dtype"] in ("int32", "int64") and "not supported" in r["reason"]
        else:
            assert r["max_abs_err"] <= (0.01 if r["dtype"] in ("float16", "bfloat16") else 1e-9)
    exact = [r for r in rows if r["status"] == "pass" and r["redop"] != "avg" and r["op"] != "barrier"]
    assert all(r["max_abs_err"] == 0 and r["ranks_agree"] is not False for r in exact)


def test_bench_every_op_measured_with_no_wrong_elements(world):
    job, _ = world
    for op in BENCH_OPS:
        rep = summarize_bench(job, BenchOptions(op=op, root=1))
        assert rep["rows"], op
        for row in rep["rows"]:
            assert row["wrong"] == 0, (op, row)
            assert row["time_us"] == max(row["per_rank_time_us"]) > 0
            assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / row["time_us"] / 1e3)
        assert {r["inplace"] for r in rep["rows"]} == ({True} if op in ("all_reduce", "broadcast", "reduce") else
                                                       {False, True} if op in ("all_gather", "reduce_scatter") else
                                                       {False})
    assert no_leftover_workers() == []
