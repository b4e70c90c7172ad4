"""bench speaks nccl-tests: -J writes its JSON document, -I its per-iteration statistics, --baseline reads its text
and JSON output (and ours) and fails the sizes that fell below it.

The fixtures are written by hand from nccl-tests' formats (NVIDIA/nccl-tests src/util.cu, version 2.19.6:
writeDeviceReport, writeResultHeader, writeBenchmarkLinePreamble/Body/Terminator, writePerIterReport,
writeResultFooter; JSON_FILE_VERSION 3):
- fixtures/nccl_tests_h100_all_reduce.txt: the text output of `all_reduce_perf -b 1K -e 1M -f 4` on two H100s,
  NCCL INFO lines included, as an NCCL node would print it;
- fixtures/nccl_tests_slow_all_reduce.json: a `-I 1 -J FILE` document of a slow two-GPU box (bus_bw of one
  in-place row is the string "nan", as jsonDouble writes NaN).
`read_like_analyze_perf_json` below reads a document the way nccl-tests' tools/analyze_perf_json.py does
(the same keys, the same nesting, the same defaults), so a file it accepts, that tool accepts.
"""

import json
import statistics
from pathlib import Path

import pytest

from distdoctor.bench.sweep import BenchOptions
from distdoctor.bench.baseline import compare, load_baseline
from distdoctor.bench.nccl_tests import format_table, iteration_stats
from distdoctor.errors import InputError

from world_helpers import distdoctor

FIX = Path(__file__).resolve().parent / "fixtures"
H100_TEXT = FIX / "nccl_tests_h100_all_reduce.txt"
SLOW_JSON = FIX / "nccl_tests_slow_all_reduce.json"


def read_like_analyze_perf_json(data: dict, in_place: bool) -> dict:
    """What nccl-tests' analyze_perf_json.py reads, read the same way (KeyError/TypeError where it would fail)."""
    key = "in_place_per_iter" if in_place else "out_of_place_per_iter"
    cfg = data.get("config", {})
    out = {"version": data.get("version"), "results": len(data.get("results", [])),
           "iterations": cfg.get("iterations"), "agg": cfg.get("aggregated_iterations", 1),
           "skip": cfg.get("per_iter_skip", 0), "stats": [], "consistent": None, "hosts": []}
    r0 = data["results"][0] if data.get("results") else {}
    nprocs = len(r0.get(key, {}).get("per_process_max_times_us", []))
    devices = cfg.get("devices", [])
    if len(devices) >= nprocs and all("hostname" in d for d in devices[:nprocs]):
        out["hosts"] = [d.get("hostname") for d in devices[:nprocs]]
    mismatches = total = 0
    for r in data["results"]:
        size = r["size"]
        per_iter = r.get(key, {})
        if not per_iter:
            continue
        spike = per_iter["max_us"] / per_iter["avg_us"] if per_iter["avg_us"] > 0 else 0
        out["stats"].append((size, per_iter["avg_us"], per_iter["min_us"], per_iter["max_us"], per_iter["p99_us"],
                             per_iter["cv_pct"], spike))
        process_times = per_iter.get("per_process_max_times_us", [])
        times = per_iter.get("times_us", [])
        for row in process_times:  # the straggler analysis: mean, stdev per process row
            statistics.stdev(row) if len(row) > 1 else 0
            sum(row) / len(row)
        if process_times and times:
            total += 1
            n = min(len(t) for t in process_times)
            expected = [max(t[i] for t in process_times) for i in range(n)]
            mismatches += len(times) != len(expected) or any(abs(a - b) >= 0.001 for a, b in zip(times, expected))
    out["consistent"] = None if total == 0 else mismatches == 0
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One real 2-rank gloo sweep with -I, -J, --html and the H100 text baseline (which it must fall below)."""
    d = tmp_path_factory.mktemp("bench")
    out = distdoctor("bench", "--nproc", "2", "-b", "1K", "-e", "16K", "-n", "6", "-w", "1", "-I", "-J",
                     d / "ours.json", "--baseline", H100_TEXT, "--html", d / "bench.html", "--format", "json",
                     timeout=180)
    assert out.stdout.strip(), out.stderr[-3000:]
    return {"rc": out.returncode, "report": json.loads(out.stdout), "doc": json.loads((d / "ours.json").read_text()),
            "dir": d, "stderr": out.stderr}


# ---------------------------------------------------------------------------------------------- -J, -I

@pytest.mark.slow
def test_J_writes_nccl_tests_json_layout(run):
    doc = run["doc"]
    assert list(doc) == ["version", "start_time", "args", "env", "nccl_version", "config", "results",
                         "out_of_bounds", "average_bus_bandwidth", "errors", "end_time"]
    assert doc["version"] == 3 and isinstance(doc["nccl_version"], int)
    cfg = doc["config"]
    assert (cfg["minimum_bytes"], cfg["maximum_bytes"], cfg["step_factor"], cfg["iterations"],
            cfg["warmup_iters"]) == (1024, 16384, 4, 6, 1)
    for flag in ("blocking_collectives", "per_iter_timing", "parallel_init"):
        assert cfg[flag] in ("true", "false")  # nccl-tests writes booleans as strings
    assert cfg["per_iter_timing"] == "true"
    assert [d["rank"] for d in cfg["devices"]] == [0, 1]
    assert set(cfg["devices"][0]) == {"rank", "group", "pid", "hostname", "device", "device_hex", "device_info"}
    assert [r["size"] for r in doc["results"]] == [1024, 4096, 16384]
    for res in doc["results"]:
        assert list(res)[:5] == ["size", "count", "type", "redop", "root"] and res["root"] == "    -1"
        assert res["type"] == "float" and res["redop"] == "sum" and res["count"] * 4 == res["size"]
        assert res["out_of_place"] is None  # torch has only the in-place all_reduce
        assert set(res["in_place"]) == {"time", "alg_bw", "bus_bw", "nwrong"} and res["in_place"]["nwrong"] == 0
        assert res["actual_iterations"] == 6
    assert doc["out_of_bounds"] == {"count": 0, "okay": "true"}
    assert doc["average_bus_bandwidth"]["okay"] == "unchecked"
    assert doc["average_bus_bandwidth"]["bandwidth"] == pytest.approx(run["report"]["avg_busbw_gbps"])


@pytest.mark.slow
def test_analyze_perf_json_reads_ours_and_theirs(run):
    ours = read_like_analyze_perf_json(run["doc"], in_place=True)
    assert ours["version"] == 3 and ours["results"] == 3 and ours["iterations"] == 6 and ours["agg"] == 1
    assert [s[0] for s in ours["stats"]] == [1024, 4096, 16384]
    assert ours["consistent"] is True  # times_us == max over the per-process rows
    assert len(ours["hosts"]) == 2
    assert read_like_analyze_perf_json(run["doc"], in_place=False)["stats"] == []  # no out-of-place all_reduce
    theirs = read_like_analyze_perf_json(json.loads(SLOW_JSON.read_text()), in_place=True)
    assert theirs["consistent"] is True and theirs["hosts"] == ["pcie01", "pcie01"]


@pytest.mark.slow
def test_I_statistics_per_size(run):
    for row in run["report"]["rows"]:
        it = row["per_iter"]
        per_rank = it["per_process_max_times_us"]
        assert len(per_rank) == 2 and all(len(t) == 6 for t in per_rank)
        assert it["times_us"] == [max(a, b) for a, b in zip(*per_rank)]
        assert it["min_us"] <= it["p50_us"] <= it["p99_us"] <= it["max_us"]
        assert it["avg_us"] == pytest.approx(statistics.fmean(it["times_us"]))
        assert it["cv_pct"] == pytest.approx(statistics.pstdev(it["times_us"]) / it["avg_us"] * 100)
    text = format_table(run["report"], BenchOptions(minbytes=1024, maxbytes=16384, iters=6, warmup=1))
    header = next(line for line in text.splitlines() if "i_min" in line).split()
    assert header.count("i_min") == 2 and header.count("i_cv%") == 2


def test_iteration_stats_follow_nccl_tests():
    stats = iteration_stats([[1.0, 5.0, 3.0, 2.0], [2.0, 1.0, 4.0, 2.0]])
    assert stats["times_us"] == [2.0, 5.0, 4.0, 2.0]
    assert (stats["min_us"], stats["max_us"], stats["p50_us"], stats["p99_us"]) == (2.0, 5.0, 4.0, 5.0)
    assert stats["p95_us"] == 5.0  # index min(n-1, (n*95+99)//100-1) of the sorted times
    assert stats["stdev_us"] == pytest.approx(statistics.pstdev([2.0, 5.0, 4.0, 2.0]))


# ---------------------------------------------------------------------------------------------- --baseline

@pytest.mark.slow
def test_below_the_nccl_tests_text_baseline_fails_naming_size_ratio_and_rank(run):
    rep = run["report"]
    assert run["rc"] == 1 and not rep["passed"]
    base = rep["baseline"]
    assert base["format"] == "nccl-tests text" and base["op"] == "all_reduce" and base["world_size"] == 2
    assert base["failed_sizes"] == [1024, 4096, 16384] and base["not_measured"] == [65536, 262144, 1048576]
    for row in base["rows"]:
        assert row["placement"] == "in_place" and row["baseline_placement"] == "in_place"
        assert row["ratio"] == pytest.approx(row["busbw_gbps"] / row["baseline_busbw_gbps"]) and not row["ok"]
    assert base["rows"][0]["baseline_busbw_gbps"] == 0.10
    first = next(f for f in rep["failures"] if f.startswith("size 1024 B"))
    assert "x the baseline's 0.1 GB/s (tolerance 10%); slowest rank" in first
    assert f"rank {rep['rows'][0]['slowest_rank']} on " in first


@pytest.mark.slow
def test_baselines_from_nccl_tests_json_and_from_our_own_outputs(run, tmp_path):
    rep = run["report"]
    slow = load_baseline(str(SLOW_JSON))
    assert slow["format"] == "nccl-tests JSON" and slow["world_size"] == 2
    assert slow["sizes"][16384] == {"out_of_place": 0.002048}  # the "nan" in-place value is no number
    cmp = compare(rep, slow, 10)
    by_size = {r["size_bytes"]: r for r in cmp["rows"]}
    assert by_size[16384]["baseline_placement"] == "out_of_place"  # its in-place busbw was nan
    assert cmp["failed_sizes"] == [] or min(r["ratio"] for r in cmp["rows"]) < 0.9
    # Our own -J file and bench JSON, read back as baselines: the same numbers, ratio 1.
    (tmp_path / "ours_report.json").write_text(json.dumps(rep))
    for path, fmt in ((run["dir"] / "ours.json", "nccl-tests JSON"), (tmp_path / "ours_report.json",
                                                                      "distdoctor bench JSON")):
        base = load_baseline(str(path))
        assert base["format"] == fmt and base["op"] == "all_reduce"
        cmp = compare(rep, base, 1)
        assert cmp["failed_sizes"] == [] and [r["size_bytes"] for r in cmp["rows"]] == [1024, 4096, 16384]
        assert all(r["ratio"] == pytest.approx(1) for r in cmp["rows"])
    # Our text table (with -I's columns) reads back too; like nccl-tests' it shows busbw to 0.01 GB/s.
    (tmp_path / "ours.txt").write_text(format_table(rep, BenchOptions(minbytes=1024, maxbytes=16384, iters=6)))
    base = load_baseline(str(tmp_path / "ours.txt"))
    assert base["format"] == "nccl-tests text" and base["op"] == "all_reduce" and base["world_size"] == 2
    assert base["sizes"] == {r["size_bytes"]: {"in_place": round(r["busbw_gbps"], 2)} for r in rep["rows"]}


def test_tolerance_rule():
    report = {"op": "all_reduce", "world_size": 2, "rank_hosts": {"0": "a", "1": "b"},
              "rows": [{"size_bytes": 1024, "inplace": True, "busbw_gbps": 0.89, "slowest_rank": 1},
                       {"size_bytes": 4096, "inplace": True, "busbw_gbps": 0.91, "slowest_rank": 0}]}
    base = {"path": "b", "format": "x", "op": "all_gather", "world_size": 8,
            "sizes": {1024: {"out_of_place": 1.0, "in_place": 1.0}, 4096: {"in_place": 1.0}}}
    cmp = compare(report, base, 10)
    assert cmp["failed_sizes"] == [1024]
    assert cmp["failures"] == ["size 1024 B: busbw 0.89 GB/s is 0.89x the baseline's 1 GB/s (tolerance 10%); "
                               "slowest rank 1 on b"]
    assert "the baseline is all_gather" in cmp["note"] and "8 ranks" in cmp["note"]
    assert compare(report, base, 12)["failed_sizes"] == []


def test_bad_baselines_are_refused_before_any_rank_starts(tmp_path):
    (tmp_path / "garbage.txt").write_text("hello\nworld\n")
    (tmp_path / "other.json").write_text(json.dumps({"a": 1}))
    (tmp_path / "cut.json").write_text(SLOW_JSON.read_text()[:200])
    for path, why in ((tmp_path / "none.json", "no such file or directory"),
                      (tmp_path / "garbage.txt", "no bandwidth row"),
                      (tmp_path / "other.json", "neither a distdoctor bench report"),
                      (tmp_path / "cut.json", "corrupt or truncated JSON")):
        out = distdoctor("bench", "--nproc", "2", "--baseline", path, timeout=60)
        assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
        assert why in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(InputError, match="no bandwidth row"):
        load_baseline(str(tmp_path / "garbage.txt"))
    out = distdoctor("bench", "--nproc", "2", "--tolerance", "-5", timeout=60)
    assert out.returncode == 2 and "--tolerance" in out.stderr


@pytest.mark.slow
def test_bench_html_page_loads_in_chromium(run):
    from chromium_cdp import errors, find_browser, load_page

    if find_browser() is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium)")
    page = load_page(str(run["dir"] / "bench.html"))
    assert errors(page) == []
    assert page["text"].split()[:5] == ["distdoctor", "bench", "FAIL:", "size", "1024"]
    assert "baseline in-place" in (run["dir"] / "bench.html").read_text()  # the H100 baseline is drawn
