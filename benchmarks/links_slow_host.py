"""`bench --links` on virtual hosts: plain links, then one host's link rate-limited, side by side in one run.

Builds a VirtualCluster (network namespaces on a bridge; needs root and iproute2), runs
`torchrun --nnodes H --nproc-per-node 1 -m distdoctor bench -b 1M -e 1M -n 3 -w 1 --links ...` on every host,
then puts a token-bucket limit (tc tbf, both directions) on host `--slow` and runs it again. Prints each link's
GB/s in both runs, the collective busbw, and the verdict (slow_hosts, ratio). No figure is asserted here.

    python benchmarks/links_slow_host.py [--hosts 3] [--slow 1] [--rate 100mbit] [--link-bytes 2M]
                                         [--link-iters 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
sys.path.insert(0, SRC)

from distdoctor.testing import netns  # noqa: E402

PORT = 29400


def run_bench(cluster: netns.VirtualCluster, program: list[str], timeout: float = 300) -> tuple[dict, float]:
    env = dict(os.environ, PYTHONPATH=SRC, PYTHONUNBUFFERED="1")
    n = len(cluster.hosts)
    start = time.monotonic()
    procs = [cluster.popen(h, [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n), "--node-rank",
                               str(h), "--nproc-per-node", "1", "--master-addr", cluster.hosts[0].addr,
                               "--master-port", str(PORT), "--max-restarts", "0", "--monitor-interval", "0.5",
                               *program], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for h in range(n)]
    try:
        out = procs[0].communicate(timeout=timeout)[0]
        for p in procs[1:]:
            p.wait(timeout=max(1, timeout - (time.monotonic() - start)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return json.loads(out), time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--slow", type=int, default=1, help="index of the host whose link is rate-limited")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--link-bytes", default="2M")
    ap.add_argument("--link-iters", default="5")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    reason = netns.unavailable_reason() or netns.tbf_unavailable_reason()
    if reason:
        print(f"cannot build virtual hosts: {reason}", file=sys.stderr)
        return 2
    program = ["-m", "distdoctor", "bench", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1", "--links",
               "--link-bytes", args.link_bytes, "--link-iters", args.link_iters, "--timeout", "60",
               "--format", "json"]
    with netns.VirtualCluster(args.hosts) as cluster:
        plain, plain_s = run_bench(cluster, program)
        cluster.rate_limit(args.slow, args.rate)
        slow, slow_s = run_bench(cluster, program)
    print(f"{args.hosts} hosts x 1 rank, gloo over veth + bridge; host{args.slow} at {args.rate} in the second run")
    print(f"{'link':<18} {'plain GB/s':>11} {'best':>8} {'limited GB/s':>13} {'best':>8}")
    for a, b in zip(plain["links"], slow["links"]):
        print(f"{a['src_host'] + ' -> ' + a['dst_host']:<18} {a['gbps']:>11.4f} {a['best_gbps']:>8.4f} "
              f"{b['gbps']:>13.4f} {b['best_gbps']:>8.4f}")
    print(f"all_reduce 1 MiB busbw: plain {plain['avg_busbw_gbps']:.4f} GB/s, "
          f"limited {slow['avg_busbw_gbps']:.4f} GB/s")
    for name, doc, secs in (("plain", plain, plain_s), ("limited", slow, slow_s)):
        print(f"{name}: slow_hosts {doc['slow_hosts']}, slow_links {doc['slow_links']}, passed {doc['passed']}, "
              f"wall {secs:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"plain": plain, "limited": slow}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
