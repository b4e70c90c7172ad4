"""`bench --links`: the round-robin schedule, the slow-host / slow-link verdict on hand-made link rows, and a
real 2-rank gloo world producing well-formed link rows (the multi-host runs are in tests/multihost)."""

import itertools
import time

import pytest

from distdoctor.bench import BenchOptions, format_table, summarize_bench
from distdoctor.bench.links import link_failures, summarize_links, tournament
from distdoctor.errors import InputError
from distdoctor.world import JobResult, LostRank, WorldConfig, run_job

from vb_helpers import no_leftover_workers, run_cli, run_json


@pytest.mark.parametrize("n", range(1, 10))
def test_tournament_covers_every_pair_once_in_disjoint_rounds(n):
    rounds = tournament(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    for r in rounds:
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))  # a host is in at most one pair per round
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


def link_job(speeds: dict[tuple[int, int], float], n_hosts: int, passes: int = 1,
             burst: dict[tuple[int, int], float] | None = None) -> JobResult:
    """One rank per host; speeds[(a, b)] in GB/s for both directions of the pair (default 1.0): each pass's
    record holds five transfers, the fastest at that speed and four at 0.9 of it (so a row's gbps is 0.9x its
    best_gbps), and round trips of 100 us. burst[(a, b)]: the pair's speed in the first pass only (load)."""
    nb = 1 << 20
    records: dict[int, list] = {r: [] for r in range(n_hosts)}
    for p in range(passes):
        for a, b in itertools.permutations(range(n_hosts), 2):
            pair = (min(a, b), max(a, b))
            gbps = (burst or {}).get(pair, 0) if p == 0 and pair in (burst or {}) else speeds.get(pair, 1.0)
            times = [nb / gbps / 1e9] + [nb / (0.9 * gbps) / 1e9] * 4
            records[a].append({"kind": "link", "src_rank": a, "dst_rank": b, "src_host": f"host{a}",
                               "dst_host": f"host{b}", "bytes": nb, "times_s": times, "trips_s": [100e-6] * 5})
    return JobResult(world_size=n_hosts, backend="gloo", device="cpu", records=records,
                     results={r: {"host": f"host{r}"} for r in range(n_hosts)})


def test_a_slow_host_is_named_and_only_it():
    # host1's link at 1/10: all of its pairs are slow, the others are not
    rep = summarize_links(link_job({(0, 1): 0.1, (1, 2): 0.1, (1, 3): 0.1}, 4), 1 << 20, 5)
    (slow,) = rep["slow_hosts"]
    assert slow["host"] == "host1" and slow["ratio"] == pytest.approx(0.1)
    assert slow["median_gbps"] == pytest.approx(0.09) and slow["others_median_gbps"] == pytest.approx(0.9)
    assert rep["slow_links"] == [] and rep["links_note"] is None
    assert link_failures(rep) == ["slow host host1: 0.1x the other hosts' link speed (0.09 vs 0.9 GB/s, median)"]


def test_two_slow_hosts_among_four_are_both_named():
    rep = summarize_links(link_job({(0, 1): 0.1, (0, 2): 0.1, (0, 3): 0.1, (1, 2): 0.1, (1, 3): 0.1}, 4), 1, 1)
    assert [s["host"] for s in rep["slow_hosts"]] == ["host0", "host1"]


def test_a_bad_cable_between_healthy_hosts_is_a_slow_link_not_a_slow_host():
    rep = summarize_links(link_job({(0, 2): 0.2}, 4), 1, 1)
    assert rep["slow_hosts"] == []
    (link,) = rep["slow_links"]
    assert link["hosts"] == ["host0", "host2"] and link["ratio"] == pytest.approx(0.2)


def test_noise_below_the_ratio_names_nothing():
    # 0.45x was seen on a healthy link of a busy machine
    rep = summarize_links(link_job({(0, 1): 0.45, (1, 2): 0.6}, 3), 1, 1)
    assert rep["slow_hosts"] == rep["slow_links"] == [] and link_failures(rep) == []


@pytest.mark.parametrize("n_hosts", [3, 4, 6])
def test_a_pair_slow_in_one_pass_only_is_load_not_a_slow_link(n_hosts):
    """A burst of load on a shared machine lasts a round, not the probe: a pair timed at 0.2x in one pass and
    at full speed in the next is pooled into one row at full speed, and nothing is named. A pair slow in every
    pass still is."""
    burst = {(0, n_hosts - 1): 0.2, (1, 2): 0.05}
    rep = summarize_links(link_job({}, n_hosts, passes=3, burst=burst), 1 << 20, 15)
    assert rep["slow_hosts"] == rep["slow_links"] == [] and link_failures(rep) == []
    assert {(r["iters"], r["passes"]) for r in rep["links"]} == {(15, 3)}
    assert all(r["best_gbps"] == pytest.approx(1.0) for r in rep["links"])
    assert all(r["latency_us"] == pytest.approx(50.0) for r in rep["links"])
    slow = summarize_links(link_job({(0, 2): 0.2}, n_hosts, passes=3, burst=burst), 1 << 20, 15)
    assert [s["hosts"] for s in slow["slow_links"]] == [["host0", "host2"]]


def test_two_hosts_cannot_tell_the_slow_side_and_do_not_guess():
    rep = summarize_links(link_job({(0, 1): 0.01}, 2), 1, 1)
    assert rep["slow_hosts"] == [] and rep["slow_links"] == []
    assert "2 hosts" in rep["links_note"] and "cannot be told apart" in rep["links_note"]


def test_no_verdict_when_a_rank_was_lost():
    job = link_job({(0, 1): 0.1, (1, 2): 0.1}, 3)
    job.lost.append(LostRank(2, "host2", "exited with code 9", "bench links round 1/3: rank 1 -> rank 2, 1 B"))
    rep = summarize_links(job, 1, 1)
    assert rep["slow_hosts"] == [] and rep["links_note"].startswith("incomplete: 1 rank(s) lost")
    assert len(rep["links"]) == 6  # what was measured is kept


def test_links_in_the_text_report():
    job = link_job({(0, 1): 0.1, (1, 2): 0.1}, 3)
    job.records[0].append({"kind": "bench", "op": "all_reduce", "dtype": "float32", "size_bytes": 4096,
                           "count": 1024, "inplace": True, "time_s": 1e-3, "wrong": 0, "rank": 0})
    opts = BenchOptions(links=True)
    rep = summarize_bench(job, opts)
    rep.update(summarize_links(job, 1 << 20, 5))
    text = format_table(rep, opts)
    assert "  host1 (1)               host0 (0)" in text
    assert ("# Slow host: host1: its links run at 0.1x the other hosts' (median 0.09 vs 0.9 GB/s; fastest 0.1 vs "
            "1 GB/s)") in text


def test_link_options_are_checked():
    for bad in (2, (4 << 30) + 1, 10**28):
        with pytest.raises(InputError, match="--link-bytes"):
            BenchOptions(link_bytes=bad).validate()
    BenchOptions(link_bytes=4 << 30).validate()
    with pytest.raises(InputError, match="--link-iters"):
        BenchOptions(link_iters=0).validate()


def test_links_on_a_real_world_gives_an_intra_host_row():
    code, doc, err = run_json("bench", "--nproc", 2, "-b", "4K", "-e", "4K", "-n", 1, "-w", 0, "--links",
                              "--link-bytes", "256K", "--link-iters", 3, timeout=240)
    assert code == 0, err[-3000:]
    assert doc["rows"] and doc["passed"]  # the sweep is still there, unchanged
    host = doc["rank_hosts"]["0"]
    assert [(r["src_rank"], r["dst_rank"]) for r in doc["links"]] == [(0, 1), (1, 0)]
    for r in doc["links"]:
        assert r["src_host"] == r["dst_host"] == host and r["bytes"] == 256 << 10
        assert r["iters"] == 3 and r["passes"] == 3  # --link-iters spread over the passes, one each
        assert r["time_us"] > 0 and r["best_gbps"] >= r["gbps"] > 0 and r["latency_us"] > 0
        assert r["gbps"] == pytest.approx(r["bytes"] / r["time_us"] / 1e3)
    assert doc["slow_hosts"] == [] and doc["links_note"] == "1 host: intra-host pairs only"
    code, out, err = run_cli("bench", "--nproc", 2, "-b", "4K", "-e", "4K", "-n", 1, "-w", 0, "--link-bytes", "1",
                             timeout=120)
    assert code == 2 and "--link-bytes" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_rank_lost_mid_probe_is_named_and_nobody_hangs():
    start = time.time()
    job = run_job("vb_jobs:links_losing_rank", {"victim": 1, "nbytes": 4096, "iters": 2},
                  WorldConfig(nproc=3, timeout_s=5))
    assert not job.ok
    assert [(lr.rank, lr.reason) for lr in job.lost] == [(1, "exited with code 7")]
    assert job.lost[0].in_op == "bench links intra-host, pass 1/2: rank 0 -> rank 1, 4096 B"  # the pair it was in
    assert time.time() - start < 5 + 15 + 10  # survivors stop within timeout + 15 s (+ startup)
    assert no_leftover_workers() == []
