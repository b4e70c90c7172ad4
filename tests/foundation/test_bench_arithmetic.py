"""bench arithmetic against hand-computed values, the nccl-tests table layout, and option checking (no world)."""

import pytest

from distdoctor.bench import BenchOptions, format_table, summarize_bench
from distdoctor.bench.sweep import count_for
from distdoctor.errors import InputError
from distdoctor.world import JobResult, LostRank


def fake_job(n, rows_by_rank, backend="gloo"):
    records = {r: [dict(row, kind="bench", rank=r) for row in rows] for r, rows in rows_by_rank.items()}
    return JobResult(world_size=n, backend=backend, device="cpu", records=records,
                     results={r: {"host": f"host{r // 2}"} for r in rows_by_rank})


def test_all_reduce_busbw_by_hand():
    # 4 ranks, 1 MiB, slowest rank 2000 us: algbw = 1048576 B / 2 ms = 0.524288 GB/s; busbw = algbw * 2*3/4
    per_rank = {0: 1000e-6, 1: 2000e-6, 2: 1500e-6, 3: 1200e-6}
    job = fake_job(4, {r: [{"op": "all_reduce", "dtype": "float32", "size_bytes": 1 << 20, "count": 1 << 18,
                            "inplace": True, "time_s": t, "wrong": 0}] for r, t in per_rank.items()})
    rep = summarize_bench(job, BenchOptions(op="all_reduce"))
    (row,) = rep["rows"]
    assert row["time_us"] == pytest.approx(2000.0)  # max over ranks
    assert row["algbw_gbps"] == pytest.approx(0.524288)
    assert row["busbw_gbps"] == pytest.approx(0.524288 * 1.5)
    assert row["slowest_rank"] == 1
    assert row["per_rank_time_us"] == pytest.approx([1000, 2000, 1500, 1200])
    assert rep["avg_busbw_gbps"] == pytest.approx(0.786432)
    assert rep["per_rank_time_us"]["1"] > 1.2 > rep["per_rank_time_us"]["0"]


@pytest.mark.parametrize("op,n,factor", [("all_gather", 8, 7 / 8), ("reduce_scatter", 4, 3 / 4),
                                         ("all_to_all", 2, 1 / 2), ("broadcast", 4, 1.0), ("reduce", 8, 1.0),
                                         ("gather", 4, 3 / 4), ("scatter", 4, 3 / 4), ("sendrecv", 4, 1.0)])
def test_busbw_factors_by_hand(op, n, factor):
    size = 1 << 20
    job = fake_job(n, {r: [{"op": op, "dtype": "float32", "size_bytes": size, "count": 1, "inplace": False,
                            "time_s": 1e-3, "wrong": 0}] for r in range(n)})
    (row,) = summarize_bench(job, BenchOptions(op=op))["rows"]
    assert row["algbw_gbps"] == pytest.approx(size / 1e-3 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(size / 1e-3 / 1e9 * factor)


def test_counts_follow_nccl_tests_size_semantics():
    assert count_for("all_reduce", 1 << 20, "float32", 4) == 1 << 18
    assert count_for("all_gather", 1 << 20, "float32", 4) == 1 << 16  # size = total gathered bytes
    assert count_for("reduce_scatter", 1 << 20, "bfloat16", 8) == 1 << 16
    assert count_for("all_to_all", 1000, "float32", 3) == 249  # 250 rounded down to a multiple of 3
    assert BenchOptions(minbytes=1024, maxbytes=16 << 20, stepfactor=4).sizes() == [1024 * 4**i for i in range(8)]
    assert BenchOptions(minbytes=4096, maxbytes=4096, stepfactor=1).sizes() == [4096]


def test_wrong_is_summed_and_lost_or_slow_fails():
    rows = {r: [{"op": "all_reduce", "dtype": "float32", "size_bytes": 64, "count": 16, "inplace": True,
                 "time_s": 1e-4, "wrong": r}] for r in range(2)}
    rep = summarize_bench(fake_job(2, rows), BenchOptions())
    assert rep["rows"][0]["wrong"] == 1 and not rep["passed"]
    rows = {r: [dict(rows[r][0], wrong=0)] for r in range(2)}
    assert summarize_bench(fake_job(2, rows), BenchOptions()).get("passed")
    slow = summarize_bench(fake_job(2, rows), BenchOptions(min_busbw=1e6))
    assert not slow["passed"] and "below --min-busbw" in slow["failures"][0]
    job = fake_job(2, rows)
    job.lost.append(LostRank(1, "host0", "exited with code 9", "bench all_reduce"))
    assert not summarize_bench(job, BenchOptions())["passed"]


def test_json_contract_field_names():
    rows = {r: [{"op": "all_reduce", "dtype": "float32", "size_bytes": 64, "count": 16, "inplace": True,
                 "time_s": 1e-4, "wrong": 0}] for r in range(2)}
    rep = summarize_bench(fake_job(2, rows), BenchOptions())
    assert {"world_size", "backend", "rows", "avg_busbw_gbps"} <= set(rep)
    assert {"op", "size_bytes", "count", "dtype", "inplace", "time_us", "algbw_gbps", "busbw_gbps",
            "wrong"} <= set(rep["rows"][0])


def test_table_is_laid_out_like_nccl_tests():
    rows = {r: [{"op": "all_reduce", "dtype": "float32", "size_bytes": 1 << 20, "count": 1 << 18, "inplace": True,
                 "time_s": 2e-3, "wrong": 0}] for r in range(4)}
    opts = BenchOptions()
    text = format_table(summarize_bench(fake_job(4, rows), opts), opts)
    lines = text.splitlines()
    header = next(i for i, l in enumerate(lines) if "out-of-place" in l)
    assert lines[header + 1].split()[1:] == ["size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                                             "#wrong", "time", "algbw", "busbw", "#wrong"]
    data = lines[header + 3]
    # nccl-tests: "%12li  %12li  %8s  %6s  %6i" then per half "  %7s  %6.2f  %6.2f  %5s"
    assert data[:12] == "%12d" % (1 << 20) and data[14:26] == "%12d" % (1 << 18)
    assert data.split() == ["1048576", "262144", "float", "sum", "-1", "N/A", "N/A", "N/A", "N/A", "2000.0",
                            "0.52", "0.79", "0"]
    assert "# Avg bus bandwidth    : 0.786432 " in lines


@pytest.mark.parametrize("kw,flag", [({"op": "frobnicate"}, "--op"), ({"dtype": "complex32"}, "--dtype"),
                                     ({"minbytes": 10, "maxbytes": 5}, "-e"), ({"iters": 0}, "-n"),
                                     ({"stepfactor": 1, "minbytes": 1, "maxbytes": 8}, "-f"),
                                     ({"redop": "xor"}, "--redop")])
def test_bad_options_name_the_flag(kw, flag):
    with pytest.raises(InputError) as exc:
        BenchOptions(**kw).validate()
    assert flag in str(exc.value)


def test_unsupported_combination_fails_with_the_backend_reason():
    job = JobResult(world_size=2, backend="gloo", device="cpu", records={
        r: [{"kind": "bench_unsupported", "op": "all_reduce", "dtype": "int32",
             "reason": "not supported by gloo: RuntimeError: result type Float can't be cast"}] for r in range(2)})
    rep = summarize_bench(job, BenchOptions(redop="avg", dtype="int32"))
    assert rep["rows"] == [] and not rep["passed"]
    assert rep["failures"] == ["all_reduce avg int32: not supported by gloo: RuntimeError: result type Float can't be cast"]
