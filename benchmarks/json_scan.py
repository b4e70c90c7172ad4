"""The compiled Flight Recorder JSON scanner on one dump, beside msgspec skipping the same bytes.

    python benchmarks/json_scan.py [--world 1024] [--entries 2000] [--rank 5] [--repeat 50]

One rank's dump as benchmarks/diagnose_scale.py writes it (about 1.1 MB at 2000 entries), in memory: the scanner
(fr_json_scan._scan_with: validation, replay or byte-by-byte scan per entry, representatives) in C, built at
install, and, as the yardstick, msgspec decoding the same bytes into a struct that skips every entry, the two
taking turns run by run. Prints best and median milliseconds of
--repeat runs each and the ratios of the bests. With PYTHONPATH=<another checkout>/src it times that checkout's
scanner (the ratio to msgspec compares across runs)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diagnose_scale import layout, rank_dump  # noqa: E402

from distdoctor.trace.loaders import fr_json_scan  # noqa: E402


class _Skip(msgspec.Struct):
    pass


class _Dump(msgspec.Struct):
    entries: list[_Skip]


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--rank", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    try:
        from distdoctor.trace.loaders._fr_json_kernel import scan as c_scan
    except ImportError:
        sys.exit("no compiled scanner: the C one is built at install, where a C compiler is found")
    kernels = {"c": c_scan}
    data = json.dumps(rank_dump(args.rank, args.world, args.entries, layout(args.world))).encode()
    for scan in kernels.values():
        got = fr_json_scan._scan_with(scan, data)
        assert got is not None and got.n == args.entries, "the scanner handed the dump over"
    skip = msgspec.json.Decoder(_Dump)
    runs: dict[str, list[float]] = {name: [] for name in (*kernels, "msgspec_skip")}
    for _ in range(args.repeat):  # in turns: a slow spell of this shared host falls on all of them
        for name, scan in kernels.items():
            runs[name].append(timed(lambda: fr_json_scan._scan_with(scan, data)))
        runs["msgspec_skip"].append(timed(lambda: skip.decode(data)))
    best = {name: round(min(r), 3) for name, r in runs.items()}
    out = {"bytes": len(data), "entries": got.n, "groups": len(got.representatives),
           **{f"{name}_ms_best_median": (best[name], round(statistics.median(r), 3)) for name, r in runs.items()},
           **{f"ratio_best_{name}_over_skip": round(best[name] / best["msgspec_skip"], 2) for name in kernels}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
