"""The long fuzz run: every fuzz target in tests/fuzz with 10 000 cases (hypothesis profile "long"); the
verdict's guarantee over generated trace sets (test_fuzz_invariant.py) with 2000 cases per property.

    python fuzz/run_fuzz.py [--profile long|ci|smoke] [-k EXPR]

Runs pytest in a child process (so a crash of the interpreter, e.g. a segfault in a parser, is reported as
such rather than killing the runner) and prints per-target wall time and the pass/fail summary.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="long", choices=["long", "ci", "smoke"])
    ap.add_argument("-k", default=None, help="only targets matching this pytest -k expression")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "fuzz"), "-q", "-p", "no:warnings", "-p",
           "no:cacheprovider", f"--hypothesis-profile={args.profile}", "--durations=0", "-o", "timeout=0"]
    if args.k:
        cmd += ["-k", args.k]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT)
    print(f"fuzz profile {args.profile}: exit {proc.returncode} after {time.monotonic() - t0:.0f} s"
          + (" (interpreter crashed: signal %d)" % -proc.returncode if proc.returncode < 0 else ""))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
