"""The compiled Flight Recorder JSON scanner on one dump, beside msgspec skipping the same bytes.

    python benchmarks/json_scan.py [--world 1024] [--entries 2000] [--rank 5] [--repeat 50]

One rank's dump as benchmarks/diagnose_scale.py writes it (about 1.1 MB at 2000 entries), in memory: the scanner
(fr_json_scan._scan_with: validation, replay or byte-by-byte scan per entry, representatives) and, as the yardstick
measured in the same run, msgspec decoding the same bytes into a struct that skips every entry. Prints best and
median milliseconds of --repeat runs each and their ratio. Needs the `fast` extra (numba). With
PYTHONPATH=<another checkout>/src it times that checkout's scanner (the ratio to msgspec compares across runs)."""

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


def timed(fn, repeat: int) -> tuple[float, float]:
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - t) * 1000)
    return round(min(runs), 3), round(statistics.median(runs), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--rank", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    scan = fr_json_scan.kernels()
    if scan is None:
        sys.exit("the compiled scanner is not available (install the `fast` extra: numba)")
    data = json.dumps(rank_dump(args.rank, args.world, args.entries, layout(args.world))).encode()
    got = fr_json_scan._scan_with(scan, data)
    assert got is not None and got.n == args.entries, "the scanner handed the dump over"
    skip = msgspec.json.Decoder(_Dump)
    ours = timed(lambda: fr_json_scan._scan_with(scan, data), args.repeat)
    theirs = timed(lambda: skip.decode(data), args.repeat)
    print(json.dumps({"bytes": len(data), "entries": got.n, "groups": len(got.representatives),
                      "scanner_ms_best_median": ours, "msgspec_skip_ms_best_median": theirs,
                      "ratio_best_scanner_over_skip": round(ours[0] / theirs[0], 2)}, indent=1))


if __name__ == "__main__":
    main()
