"""A slow link between two hosts: `distdoctor bench` across them shows the bandwidth drop, names the interface it
used and which host each rank is on. netem delay where the kernel has it (skipped with the reason otherwise);
a token-bucket rate limit (tbf), which every kernel offers, as the slow link that always runs."""

from __future__ import annotations

import json

import pytest

from distdoctor.testing import netns

from mh_helpers import Job, torchrun_argv

BENCH = ["-m", "distdoctor", "bench", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1", "--timeout", "60",
         "--format", "json"]

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def _bench(cluster) -> dict:
    job = Job(cluster).start({h: torchrun_argv(cluster, h, 2, BENCH) for h in (0, 1)})
    host0, host1 = job.wait(240)
    assert host0.returncode == 0 and host1.returncode == 0, job.log()
    return json.loads(host0.stdout)


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
    base = _bench(cluster)
    cluster.rate_limit(1, "100mbit")  # 12.5 MB/s each way vs. several hundred MB/s on the bare veth
    _check_slowdown(base, _bench(cluster), factor=3)


def test_delayed_link_shows_in_bench(netns_ok):
    reason = netns.netem_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with netns.VirtualCluster(2) as cluster:
        base = _bench(cluster)
        cluster.delay(1, 20)
        _check_slowdown(base, _bench(cluster), factor=2)
