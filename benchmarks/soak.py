"""Soak: `validate` in a loop for N minutes, a random fault injected each round, in one driving process.

Each round runs distdoctor's own validate (standalone world, real worker processes over gloo) in this process
via `run_validate`, with one of: none, corrupt, delay (a straggler), crash, skip, on a random rank. Checked
every round: the verdict is right (pass with no fault; fail naming exactly the injected rank with a fault).
Checked over the run: this process's open file descriptors, threads and child processes do not grow (sampled
after each round; growth = last - first after a warm-up round). Exit 1 if any round was wrong or anything grew.

    python benchmarks/soak.py --minutes 5 [--nproc 3] [--seed 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from distdoctor.validate.sweep import ValidateOptions, run_validate  # noqa: E402
from distdoctor.world import WorldConfig  # noqa: E402

FAULTS = ("none", "corrupt", "delay", "crash", "skip")


def resources() -> dict:
    me = os.getpid()
    children = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == me:  # ppid
                    children += 1
            except (OSError, IndexError, ValueError):
                pass
    return {"fds": len(os.listdir("/proc/self/fd")), "threads": len(os.listdir("/proc/self/task")),
            "py_threads": threading.active_count(), "children": children}


def one_round(rng: random.Random, nproc: int, timeout_s: float) -> dict:
    fault = rng.choice(FAULTS)
    rank = rng.randrange(nproc)
    inject = () if fault == "none" else (f"delay:{rank}:0.4",) if fault == "delay" else (f"{fault}:{rank}",)
    # A small case list keeps rounds short; the sizes include 0 and an odd count, the usual edge cases.
    opts = ValidateOptions(ops=("all_reduce", "broadcast", "all_gather", "reduce_scatter"), dtypes=("float32",),
                           sizes="0,1,1023", inject=inject, subgroups=False)
    t0 = time.monotonic()
    report = run_validate(WorldConfig(nproc=nproc, timeout_s=timeout_s), opts)
    wall = time.monotonic() - t0
    culprits = report.get("culprit_ranks", [])
    if fault == "none":
        right = report["passed"] and not culprits
    else:
        right = (not report["passed"]) and culprits == [rank]
    return {"fault": fault, "rank": rank if fault != "none" else None, "passed": report["passed"],
            "culprits": culprits, "right": right, "wall_s": round(wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--nproc", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=15.0, help="collective timeout of each round (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the per-round log and the summary here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.minutes * 60
    rounds, samples = [], []
    while time.monotonic() < deadline or not rounds:
        r = one_round(rng, args.nproc, args.timeout)
        samples.append(resources())
        rounds.append(r)
        print(f"round {len(rounds):3d}: {r['fault']:8s} rank {str(r['rank']):4s} -> "
              f"{'pass' if r['passed'] else 'fail'} culprits {r['culprits']} {'ok' if r['right'] else 'WRONG'} "
              f"({r['wall_s']} s) {samples[-1]}", file=sys.stderr, flush=True)
    base = samples[0]  # after the first round: imports and lazily created threads are in place
    growth = {k: samples[-1][k] - base[k] for k in base}
    peak = {k: max(s[k] for s in samples) - base[k] for k in base}
    summary = {
        "rounds": len(rounds), "minutes": args.minutes, "nproc": args.nproc, "seed": args.seed,
        "wrong_verdicts": [r for r in rounds if not r["right"]],
        "by_fault": {f: sum(r["fault"] == f for r in rounds) for f in FAULTS},
        "resource_first": base, "resource_last": samples[-1], "growth": growth, "peak_over_first": peak,
        "median_round_s": sorted(r["wall_s"] for r in rounds)[len(rounds) // 2],
    }
    ok = not summary["wrong_verdicts"] and all(v <= 0 for v in growth.values()) and samples[-1]["children"] == 0
    summary["ok"] = ok
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rounds": rounds, "samples": samples}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
