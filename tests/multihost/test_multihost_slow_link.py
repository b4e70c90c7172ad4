"""A slow link: `distdoctor bench` across hosts shows the bandwidth drop, names the interface it used and which
host each rank is on, and `bench --links` (point-to-point per host pair) names the slow host. netem delay where
the kernel has it (skipped with the reason otherwise); a token-bucket rate limit (tbf), which every kernel
offers, as the slow link that always runs."""

from __future__ import annotations

import json

import pytest

from distdoctor.testing import netns

from mh_helpers import Job, torchrun_argv

BENCH = ["-m", "distdoctor", "bench", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1", "--timeout", "60",
         "--format", "json"]
# The link probe: a one-row sweep, then 2 MiB transfers (170 ms each through a 100 Mbit link).
LINKS = ["-m", "distdoctor", "bench", "-b", "64K", "-e", "64K", "-n", "1", "-w", "0", "--links", "--link-bytes",
         "2M", "--link-iters", "5", "--timeout", "60", "--format", "json"]

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def _run(cluster, nproc: int, program: list[str], rc: int = 0) -> dict:
    hosts = range(len(cluster.hosts))
    job = Job(cluster).start({h: torchrun_argv(cluster, h, nproc, program) for h in hosts})
    results = job.wait(240)
    assert [r.returncode for r in results] == [rc] + [0] * (len(results) - 1), job.log()
    return json.loads(results[0].stdout)


def _check_slowdown(base: dict, slow: dict, factor: float) -> None:
    assert base["iface"] == slow["iface"] == netns.IFACE
    assert base["rank_hosts"] == {"0": "host0", "1": "host0", "2": "host1", "3": "host1"}
    assert slow["avg_busbw_gbps"] * factor < base["avg_busbw_gbps"], (base["avg_busbw_gbps"], slow["avg_busbw_gbps"])
    for row in slow["rows"]:
        assert len(row["per_rank_time_us"]) == 4 and row["wrong"] in (0, None)


def test_rate_limited_link_shows_in_bench(cluster):
    reason = netns.tbf_unavailable_reason()
    if reason:
        pytest.skip(reason)
    base = _run(cluster, 2, BENCH)
    cluster.rate_limit(1, "100mbit")  # 12.5 MB/s each way vs. several hundred MB/s on the bare veth
    slow = _run(cluster, 2, [*BENCH, "--links", "--link-bytes", "1M", "--link-iters", "2"])
    _check_slowdown(base, slow, factor=3)
    # Two hosts: one inter-host link, both directions, and each host's two ranks; the slow side is not guessed.
    assert [(r["src_rank"], r["dst_rank"]) for r in slow["links"]] == [(0, 2), (2, 0), (0, 1), (1, 0), (2, 3),
                                                                       (3, 2)]
    assert all(r["gbps"] < 0.0125 * 1.1 for r in slow["links"][:2])  # 100 Mbit = 0.0125 GB/s
    assert slow["slow_hosts"] == [] and "cannot be told apart" in slow["links_note"] and slow["passed"]


def test_links_name_the_rate_limited_host(netns_ok):
    """Three hosts, one rank each: unthrottled, no host is named; host1's link at 100 Mbit, host1 and only it."""
    reason = netns.tbf_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with netns.VirtualCluster(3) as cluster:
        base = _run(cluster, 1, LINKS)
        cluster.rate_limit(1, "100mbit")
        slow = _run(cluster, 1, LINKS, rc=1)  # a slow host fails the run, like --min-busbw
    hosts = ["host0", "host1", "host2"]
    for doc in (base, slow):
        assert doc["rank_hosts"] == {"0": "host0", "1": "host1", "2": "host2"}
        # every ordered pair of hosts, once, with the sender's and receiver's ranks
        pairs = sorted((r["src_host"], r["dst_host"]) for r in doc["links"])
        assert pairs == sorted((a, b) for a in hosts for b in hosts if a != b)
        for r in doc["links"]:
            assert r["src_rank"] == hosts.index(r["src_host"]) and r["dst_rank"] == hosts.index(r["dst_host"])
            assert r["bytes"] == 2 << 20 and r["gbps"] > 0 and r["time_us"] > 0 and r["latency_us"] > 0
    assert base["slow_hosts"] == [] and base["slow_links"] == [] and base["passed"], base["links"]
    assert [s["host"] for s in slow["slow_hosts"]] == ["host1"], slow["links"]
    (s,) = slow["slow_hosts"]
    assert s["ratio"] < 0.5 and s["median_gbps"] < 0.0125 * 1.1  # 100 Mbit = 0.0125 GB/s, each way
    assert slow["slow_links"] == [] and any("slow host host1" in f for f in slow["failures"])
    untouched = [r["gbps"] for r in slow["links"] if "host1" not in (r["src_host"], r["dst_host"])]
    assert min(untouched) > 3 * max(r["gbps"] for r in slow["links"] if "host1" in (r["src_host"], r["dst_host"]))


def test_delayed_link_shows_in_bench(netns_ok):
    reason = netns.netem_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with netns.VirtualCluster(2) as cluster:
        base = _run(cluster, 2, BENCH)
        cluster.delay(1, 20)
        _check_slowdown(base, _run(cluster, 2, BENCH), factor=2)
