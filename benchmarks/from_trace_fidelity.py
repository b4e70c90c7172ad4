"""How close `sim from-trace`'s replay of a healthy real-library job comes to the run it recorded: the simulated
makespan over the recorded one (the replay's `ratio`), for the DDP, FSDP2, HSDP and pipelining jobs of the
real-library suite (tests/doctor/real).

    python benchmarks/from_trace_fidelity.py [--rounds 1] [--parallel 1] [--data DIR]

Records the jobs afresh each round (tests/doctor/real/suite.py's run_suite: `distdoctor run` over 4 Gloo ranks,
`--parallel` jobs at once), or reads the recordings already in `--data` (a run_suite output directory, e.g. the
test session's `realjobs0`). Each recording is replayed as the suite's test does (`trials=4, jitter=0.3`).

The ratio is a wall-clock figure: the replay starts each call when the rank issued it and gives it the time its
instance took, and what it loses is the host's time inside async calls it cannot see. Under load that time grows,
so the ratio moves with the machine's load; it is a figure here, never an assertion in a test.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
HEALTHY = ("ddp_ok", "fsdp_ok", "hsdp_ok", "pp_ok")


def _suite():
    spec = importlib.util.spec_from_file_location("distdoctor_real_suite", ROOT / "tests/doctor/real/suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(parallel: int) -> str:
    out = tempfile.mkdtemp(prefix="distdoctor-fidelity-")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    _suite().run_suite(out, list(HEALTHY), parallel=parallel, env=env)
    return out


def ratio(recorder_dir: str) -> float:
    from distdoctor.sim.plans.from_trace import load_recorded, replay_program
    from distdoctor.sim.result import simulate

    replay = replay_program(load_recorded([recorder_dir]))
    res = simulate(replay.program, trials=4, jitter=0.3, jitter_comm=True)
    if res.deadlock:
        sys.exit(f"{recorder_dir}: the replay of a healthy job deadlocked")
    return replay.info(res.state.makespan)["ratio"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=1, help="jobs recorded at once (the test session runs 4)")
    ap.add_argument("--data", help="read the recordings of this run_suite output directory instead")
    args = ap.parse_args()
    ratios: dict[str, list[float]] = {name: [] for name in HEALTHY}
    loads = []
    for _ in range(1 if args.data else args.rounds):
        out = args.data or record(args.parallel)
        loads.append(os.getloadavg()[0])
        for name in HEALTHY:
            ratios[name].append(ratio(os.path.join(out, name, "recorder")))
    for name, got in ratios.items():
        print(f"{name:8s} simulated / recorded makespan: median {statistics.median(got):.3f} "
              f"({', '.join(f'{r:.3f}' for r in got)})")
    print(f"load average (1 min) after each round: {', '.join(f'{x:.1f}' for x in loads)}")


if __name__ == "__main__":
    main()
