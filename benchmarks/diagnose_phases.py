"""Where `distdoctor diagnose` spends its CPU: load (parent and worker processes) and analysis, per entry.

    python benchmarks/diagnose_phases.py [DIR]    # default: the JSON dumps of benchmarks/diagnose_scale.py

Runs in this process with this checkout's `src` first on the path; CPU is user + sys from getrusage (the load
workers are counted as children once they have exited).
"""

import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from distdoctor.diagnose.analyze import analyze  # noqa: E402
from distdoctor.trace.loaders import gc_paused, load_traces  # noqa: E402


def cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def main() -> None:
    data = sys.argv[1] if len(sys.argv) > 1 else "/tmp/distdoctor-diagnose-scale/1024x2000/json"
    c0, w0 = cpu(), time.perf_counter()
    ts = load_traces([data])
    c1, w1 = cpu(), time.perf_counter()
    n = sum(len(t.entries) for t in ts.ranks.values()) or 1
    with gc_paused():  # as `distdoctor diagnose` runs it
        report = analyze(ts)
    c2, w2 = cpu(), time.perf_counter()
    json.dumps(report.to_json(), indent=2)
    c3 = cpu()
    parent, workers = c1[0] - c0[0], c1[1] - c0[1]
    print(f"entries {n}: load wall {w1 - w0:.1f} s, CPU parent {parent:.1f} s + workers {workers:.1f} s "
          f"= {(parent + workers) / n * 1e6:.2f} us/entry (parent {parent / n * 1e6:.2f}, "
          f"workers {workers / n * 1e6:.2f})")
    print(f"analysis wall {w2 - w1:.1f} s, CPU {c2[0] - c1[0]:.1f} s = {(c2[0] - c1[0]) / n * 1e6:.2f} us/entry; "
          f"rendering JSON {c3[0] - c2[0]:.1f} s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB, "
          f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
