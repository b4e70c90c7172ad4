"""The cluster HTML report of a real sweep on four virtual hosts, one of them slowed down (docs/cluster-report.png).

Needs root and iproute2 (network namespaces on a bridge: distdoctor.testing.netns) and, for the screenshot,
Chromium. Steps:
1. `bench --links -J plain.json` on four hosts, one rank each, over gloo: the baseline, in nccl-tests' format;
2. host2's link limited to 100 Mbit/s (tc tbf);
3. the same bench with `-I --baseline plain.json --html cluster-report.html`: the busbw falls below the
   baseline at every size and the link matrix shows host2 as the slow host;
4. a headless Chromium screenshot of the page.

    python examples/cluster_report_netns.py [--out docs] [--hosts 4] [--slow 2]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)

from distdoctor.testing import netns  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from links_slow_host import run_bench  # noqa: E402 - torchrun on every virtual host, rank 0's JSON back


def bench_on_every_host(cluster: netns.VirtualCluster, args: list[str]) -> dict:
    return run_bench(cluster, ["-m", "distdoctor", "bench", *args, "--format", "json"])[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs"))
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--slow", type=int, default=2)
    args = ap.parse_args()
    reason = netns.unavailable_reason() or netns.tbf_unavailable_reason()
    if reason:
        print(f"cannot build virtual hosts: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="distdoctor-report-"))
    out = Path(args.out)
    sweep = ["-b", "64K", "-e", "4M", "-f", "4", "-n", "5", "-w", "1", "--links", "--link-bytes", "1M",
             "--link-iters", "3", "--timeout", "60"]
    with netns.VirtualCluster(args.hosts) as cluster:
        plain = bench_on_every_host(cluster, [*sweep, "-J", str(work / "plain.json")])
        cluster.rate_limit(args.slow, "100mbit")
        slow = bench_on_every_host(cluster, [*sweep, "-I", "--baseline", str(work / "plain.json"), "--html",
                                             str(out / "cluster-report.html")])
    print(f"plain: avg busbw {plain['avg_busbw_gbps']:.4g} GB/s, passed {plain['passed']}")
    print(f"host{args.slow} limited: avg busbw {slow['avg_busbw_gbps']:.4g} GB/s, passed {slow['passed']}")
    for why in slow["failures"]:
        print(f"  {why}")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1100,1700", f"--screenshot={out / 'cluster-report.png'}",
                        f"file://{out / 'cluster-report.html'}"], capture_output=True, timeout=60, check=False)
        print(f"screenshot: {out / 'cluster-report.png'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
