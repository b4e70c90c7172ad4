"""`distdoctor lint` at scale: synthetic healthy runs, 4 ranks x 2000 recorder calls and 1024 ranks x 2000 Flight
Recorder entries, each linted in a fresh child process.

    python benchmarks/lint_scale.py [--sets 4x2000,1024x2000] [--rounds 3] [--data DIR] [--plant]

- `4x2000`-style sets of up to 64 ranks are the recorder's own dumps (`rank_<r>.jsonl`, distdoctor-trace format):
  a 2-D layout (tensor-parallel pairs, data-parallel groups across them, the default group), every collective with
  a call site, a batched p2p ring exchange every step, the groups' creation recorded in the header: every check
  has its evidence and none should fire.
- larger sets are NCCL-style Flight Recorder JSON dumps from benchmarks/diagnose_scale.py's layout and step (tensor-
  parallel groups of 8, data-parallel groups across them, the default group), every entry completed.
- `--plant`: also each set with one order inversion planted (half of one data-parallel group issues a step's
  all_gather after the default group's all_reduce, not before): the verdict must change to `hazards` with it.
Prints one JSON line per run and the markdown rows for docs/benchmarks.md (median wall of --rounds).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, dumps  # noqa: E402


def _diagnose_scale():
    spec = importlib.util.spec_from_file_location("diagnose_scale", ROOT / "benchmarks" / "diagnose_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fr_dump(ds, rank: int, world: int, n: int, groups: dict, plant: bool) -> dict:
    """A healthy rank's Flight Recorder JSON (diagnose_scale's layout and step, everything completed)."""
    tp, dp = f"tp{rank // ds.TP}", f"dp{rank % ds.TP}"
    names = {"tp": tp, "dp": dp, "0": "0"}
    pg_config = {g: {"name": g, "desc": "default_pg" if g == "0" else g, "ranks": json.dumps(groups[g])}
                 for g in ("0", tp, dp)}
    seqs = {g: 0 for g in names.values()}
    n_dp = len(groups[dp])
    rows = []
    for i in range(n):
        kind, op, sizes, dtype = ds.STEP[i % len(ds.STEP)]
        g = names[kind]
        seqs[g] += 1
        out = [[sizes[0][0] // n_dp]] if op == "reduce_scatter" else [[sizes[0][0] * n_dp]] if op == "all_gather" \
            else sizes
        rows.append((g, kind, op, sizes, out, dtype, seqs[g]))
    if plant and rank % ds.TP == 0 and rank < world // 2:  # swap step 10's dp all_gather and world all_reduce
        k = 10 * len(ds.STEP) + 7
        rows[k], rows[k + 1] = rows[k + 1], rows[k]
    entries = []
    t0 = 1_700_000_000_000_000_000
    for i, (g, kind, op, sizes, out, dtype, seq) in enumerate(rows):
        t = t0 + i * 3_000_000 + (rank % 7) * 1000
        entries.append({
            "record_id": i, "pg_id": 0 if g == "0" else (1 if kind == "tp" else 2), "process_group": [g, g],
            "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{op}",
            "time_created_ns": t, "input_sizes": sizes, "input_dtypes": [dtype], "output_sizes": out,
            "output_dtypes": [dtype], "state": "completed", "time_discovered_started_ns": t + 5000,
            "time_discovered_completed_ns": t + 900_000, "retired": True, "timeout_ms": 600000, "is_p2p": False,
            "thread_id": "140000000000000", "thread_name": "pt_main_thread"})
    return {"version": "2.10", "pg_config": pg_config, "pg_status": {}, "comm_lib_version": "2.21.5",
            "nccl_comm_state": {}, "entries": entries}


# The recorder's step: (group kind, op, call-site line); then a batched ring exchange.
NATIVE_STEP = [("tp", "all_reduce", 40)] * 3 + [("dp", "all_gather", 52), ("0", "all_reduce", 55),
                                                 ("dp", "reduce_scatter", 60)]


def native_dump(rank: int, world: int, n: int, plant: bool) -> str:
    tp_size = 2
    tp, dp = f"tp{rank // tp_size}", f"dp{rank % tp_size}"
    members = {"0": list(range(world)), tp: [r for r in range(world) if r // tp_size == rank // tp_size],
               dp: [r for r in range(world) if r % tp_size == rank % tp_size]}
    names = {"tp": tp, "dp": dp, "0": "0"}
    seqs = {g: 0 for g in members}
    p2p = {"send": 0, "recv": 0}
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    entries: list[Entry] = []
    t = 1_700_000_000.0
    step_len = len(NATIVE_STEP) + 2
    plan = []
    batch_t = t
    for i in range(n):
        k = i % step_len
        plan.append(NATIVE_STEP[k] if k < len(NATIVE_STEP) else ("p2p", "send" if k == len(NATIVE_STEP) else "recv", 70))
    if plant and rank % tp_size == 0 and rank < world // 2:
        k = 10 * step_len + 3  # step 10's dp all_gather after the world all_reduce
        plan[k], plan[k + 1] = plan[k + 1], plan[k]
    for i, (kind, op, line) in enumerate(plan):
        t += 0.001
        frames = [Frame("main", "/job/train.py", 120), Frame("step", "/job/train.py", line)]
        common = dict(index=i, state="completed", t_created=t, t_started=t, t_completed=t + 0.0005,
                      in_sizes=[[1024]], out_sizes=[[1024]], in_dtypes=["float32"], out_dtypes=["float32"],
                      stream="MainThread", frames=frames)
        if kind == "p2p":  # one batch_isend_irecv: its calls share their start time
            p2p[op] += 1
            batch_t = t if op == "send" else batch_t
            entries.append(Entry(group="0", op=op, p2p_seq=p2p[op], peer=nxt if op == "send" else prev,
                                 raw_op=f"batch_isend_irecv:i{op}", async_op=True,
                                 **{**common, "t_started": batch_t}))
            continue
        g = names[kind]
        seqs[g] += 1
        entries.append(Entry(group=g, op=op, seq=seqs[g], raw_op=op, **common))
    creations = [{"api": "init_device_mesh", "mesh_shape": [world // tp_size, tp_size], "dim_names": ["dp", "tp"],
                  "index": 0, "frames": [{"name": "main", "filename": "/job/train.py", "line": 30}]}]
    trace = RankTrace(rank=rank, source="native", world_size=world,
                      groups={g: GroupInfo(g, m) for g, m in members.items()}, entries=entries,
                      dump_reason="exit: normal exit", group_creations=creations)
    return dumps(trace)


def generate(data: Path, world: int, n: int, plant: bool) -> Path:
    d = data / f"{world}x{n}{'-planted' if plant else ''}"
    stamp = d / ".complete"
    if stamp.exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    if world <= 64:
        for r in range(world):
            (d / f"rank_{r}.jsonl").write_text(native_dump(r, world, n, plant))
    else:
        ds = _diagnose_scale()
        groups = ds.layout(world)
        for r in range(world):
            (d / f"rank_{r}.json").write_text(json.dumps(fr_dump(ds, r, world, n, groups, plant)))
    stamp.write_text("ok")
    return d


def timed_lint(d: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t = time.perf_counter()
    before = os.times()
    p = subprocess.run([sys.executable, "-m", "distdoctor", "lint", str(d), "--format", "json"], env=env,
                       capture_output=True, timeout=600)
    wall = time.perf_counter() - t
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        return {"rc": p.returncode, "error": p.stderr.decode(errors="replace")[-500:]}
    return {"rc": p.returncode, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "verdict": doc["verdict"],
            "hazards": [(h["kind"], len(h["ranks"])) for h in doc["hazards"]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", default="4x2000,1024x2000")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", default=None, help="keep the generated dumps here (default: a temp dir, removed)")
    ap.add_argument("--plant", action="store_true", help="also lint each set with one planted order inversion")
    args = ap.parse_args()
    tmp = None if args.data else tempfile.TemporaryDirectory()
    data = Path(args.data or tmp.name)
    load = os.getloadavg()[0]
    rows = []
    for spec in args.sets.split(","):
        world, n = (int(x) for x in spec.split("x"))
        for plant in ((False, True) if args.plant else (False,)):
            d = generate(data, world, n, plant)
            runs = [timed_lint(d) for _ in range(args.rounds)]
            for r in runs:
                print(json.dumps({"set": spec, "planted": plant, **r}), flush=True)
            walls = [r["wall_s"] for r in runs if "wall_s" in r]
            cpus = [r["cpu_s"] for r in runs if "cpu_s" in r]
            rows.append((spec, plant, walls, cpus, runs[-1].get("verdict"), runs[-1].get("hazards")))
    machine = f"{os.cpu_count()} cores, {platform.python_version()} (load {load:.1f}-{os.getloadavg()[0]:.1f})"
    print(f"\n{machine}")
    for spec, plant, walls, cpus, verdict, hazards in rows:
        world, n = spec.split("x")
        what = "recorder dumps" if int(world) <= 64 else "Flight Recorder JSON dumps"
        label = f"`lint` of {world} ranks x {n} calls ({what}{', one inversion planted' if plant else ''})"
        print(f"| {label} | {statistics.median(walls):.2f} s wall median ({' / '.join(f'{w:.2f}' for w in walls)}),"
              f" CPU {statistics.median(cpus):.2f} s; {verdict} {hazards or ''} | `python benchmarks/lint_scale.py "
              f"--sets {args.sets} --rounds {args.rounds}{' --plant' if args.plant else ''}` | {machine} | "
              f"{time.strftime('%Y-%m-%d')} |")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
