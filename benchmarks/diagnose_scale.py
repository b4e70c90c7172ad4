"""Analyzer at scale: 1024 ranks x 2000 Flight Recorder entries each, diagnosed from JSON dumps.

    python benchmarks/diagnose_scale.py [--ranks 1024] [--entries 2000] [--data DIR] [--skip-torchfrtrace]
        [--rounds N] [--baseline OTHER_CHECKOUT]    # e.g. git worktree add /tmp/prev <older commit>
        [--form json|pickle] [--scanner on|off] [--gen-jobs N] [--generate-only]

    # a set where every collective runs on the world-sized group (also small, mix):
    python benchmarks/diagnose_scale.py --ranks 4096 --entries 200 --layout world --skip-torchfrtrace
    # the largest set (about 20 GB of JSON and 7 GB of pickles; delete the directory afterwards):
    nice python benchmarks/diagnose_scale.py --ranks 16384 --data /tmp/scale-data --gen-jobs 2 --skip-torchfrtrace

Generates synthetic but realistic NCCL-style dumps (pg_config with members; all_reduce / reduce_scatter /
all_gather / broadcast with realistic sizes and timestamps; entries completed and retired) in one of four
layouts (--layout):
- tp (the default): tensor-parallel groups of 8, data-parallel groups across them, the default group; one planted
  fault: rank 777 stops in its data loader, so its tensor-parallel peers hang in the next all_reduce;
- world: every collective on the default group (pure data parallel, or FSDP over the whole world), one rank
  that never issued the last all_reduce the others hang in;
- small: every collective on many small groups (of 8), the rank's group hangs behind the same lost rank;
- mix: steps alternating between the default group and the small groups, the same fault. Writes each dump as JSON
(`_dump_fr_trace_json` layout) and as pickle (for torchfrtrace), then times, each in a fresh child process:
- `distdoctor diagnose DIR --format json` on the JSON (or --form pickle) dumps: wall and CPU seconds and peak
  RSS of its largest process (the median of --rounds
  runs; with --baseline, another checkout's diagnose alternates with it on the same dumps, side by side, and the
  two reports are compared byte for byte);
- torchfrtrace (`python -m torch.distributed.flight_recorder.fr_trace DIR -p rank_`) on the pickle dumps, with a
  time limit: what happened, its wall seconds and peak RSS.
Prints a JSON summary and the markdown rows for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TP = 8
FAULT_RANK = 777  # for --ranks 1024; smaller worlds use the rank at the same relative place


def fault_rank(world: int) -> int:
    return FAULT_RANK if world == 1024 else (world * 3) // 4 + 9 % TP


def layout(world: int) -> dict[str, list[int]]:
    groups = {"0": list(range(world))}
    for k in range(world // TP):  # tensor parallel: consecutive ranks
        groups[f"tp{k}"] = list(range(k * TP, (k + 1) * TP))
    for j in range(TP):  # data parallel: same position in every tp group
        groups[f"dp{j}"] = list(range(j, world, TP))
    return groups


STEP = ([("tp", "all_reduce", [[4096, 1024]], "BFloat16")] * 6
        + [("dp", "reduce_scatter", [[8388608]], "Float"), ("dp", "all_gather", [[1048576]], "Float"),
           ("0", "all_reduce", [[1]], "Float"), ("tp", "broadcast", [[256]], "Long")])
# The other layouts (--layout): "tp" names the rank's small group (of TP ranks) there, "dp" the world.
STEPS = {"tp": STEP,
         "world": [("0", "all_gather", [[1048576]], "BFloat16")] * 4 + [("0", "reduce_scatter", [[8388608]], "Float"),
                   ("0", "all_reduce", [[1]], "Float")],
         "small": [("tp", "all_reduce", [[4096, 1024]], "BFloat16")] * 4 + [("tp", "broadcast", [[256]], "Long")],
         "mix": [("tp", "all_reduce", [[4096, 1024]], "BFloat16")] * 3 + [("0", "all_reduce", [[1024]], "Float"),
                 ("0", "broadcast", [[256]], "Long")]}
LAYOUT = "tp"  # set by main (--layout); the workers that write dumps inherit it


def rank_dump(rank: int, world: int, n_entries: int, groups: dict[str, list[int]]) -> dict:
    if LAYOUT != "tp":
        return _layout_dump(rank, world, n_entries, groups)
    tp, dp = f"tp{rank // TP}", f"dp{rank % TP}"
    names = {"tp": tp, "dp": dp, "0": "0"}
    pg_config = {g: {"name": g, "desc": "default_pg" if g == "0" else g, "ranks": json.dumps(groups[g])}
                 for g in ("0", tp, dp)}
    seqs = {g: 0 for g in names.values()}
    entries = []
    t0 = 1_700_000_000_000_000_000
    fault = fault_rank(world)
    stop = n_entries - 5 if rank == fault else None
    n_dp = len(groups[dp])
    for i in range(n_entries):
        if stop is not None and i >= stop:
            break
        kind, op, sizes, dtype = STEP[i % len(STEP)]
        g = names[kind]
        seqs[g] += 1
        out = sizes
        if op == "reduce_scatter":
            out = [[sizes[0][0] // n_dp]]
        elif op == "all_gather":
            out = [[sizes[0][0] * n_dp]]
        # the peers of the lost rank issue the all_reduce they then hang in, the rest of the world hangs later
        hung = (rank // TP == fault // TP and i >= n_entries - 5) or i >= n_entries - 1
        t = t0 + i * 3_000_000 + (rank % 7) * 1000
        entries.append(_entry(i, g, 0 if g == "0" else (1 if kind == "tp" else 2), seqs[g], op, sizes, out, dtype,
                              t, hung))
        if hung and kind == "tp":
            break  # a rank blocks in its first hung collective
    return {"version": "2.10", "pg_config": pg_config,
            "pg_status": {}, "comm_lib_version": "2.21.5", "nccl_comm_state": {}, "entries": entries}


def _entry(i: int, g: str, pg_id: int, seq: int, op: str, sizes: list, out: list, dtype: str, t: int,
           hung: bool) -> dict:
    """One entry as torch's NCCL Flight Recorder writes it (completed and retired unless `hung`)."""
    return {
        "record_id": i, "pg_id": pg_id, "process_group": [g, g],
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"nccl:{op}",
        "time_created_ns": t, "input_sizes": sizes, "input_dtypes": [dtype], "output_sizes": out,
        "output_dtypes": [dtype], "state": "scheduled" if hung else "completed",
        "time_discovered_started_ns": 0 if hung else t + 5000,
        "time_discovered_completed_ns": 0 if hung else t + 900_000, "retired": not hung,
        "timeout_ms": 600000, "is_p2p": False, "thread_id": "140000000000000", "thread_name": "pt_main_thread",
    }


def _layout_dump(rank: int, world: int, n_entries: int, groups: dict[str, list[int]]) -> dict:
    """A dump of the world, small or mix layout: the fault rank never issues the last collective on its group
    (the default group for world and mix), which every other member is hung in."""
    small = f"tp{rank // TP}"
    names = {"tp": small, "0": "0"}
    step = STEPS[LAYOUT]
    kinds = {kind for kind, *_ in step}
    pg_config = {g: {"name": g, "desc": "default_pg" if g == "0" else g, "ranks": json.dumps(groups[g])}
                 for g in ("0", small) if g == "0" or "tp" in kinds}
    fault = fault_rank(world)
    last_kind = "0" if "0" in kinds else "tp"
    in_fault_group = last_kind == "0" or rank // TP == fault // TP
    seqs = {g: 0 for g in names.values()}
    entries = []
    t0 = 1_700_000_000_000_000_000
    for i in range(n_entries):
        kind, op, sizes, dtype = step[i % len(step)] if i < n_entries - 1 else (last_kind, "all_reduce", [[1]], "Float")
        if rank == fault and i == n_entries - 1:
            break  # never issued the last collective
        g = names[kind]
        seqs[g] += 1
        n = len(groups[g])
        out = [[sizes[0][0] // n]] if op == "reduce_scatter" else [[sizes[0][0] * n]] if op == "all_gather" else sizes
        hung = i == n_entries - 1 and in_fault_group
        t = t0 + i * 3_000_000 + (rank % 7) * 1000
        entries.append(_entry(i, g, 0 if g == "0" else 1, seqs[g], op, sizes, out, dtype, t, hung))
    return {"version": "2.10", "pg_config": pg_config,
            "pg_status": {}, "comm_lib_version": "2.21.5", "nccl_comm_state": {}, "entries": entries}


def _dump_bytes(rank: int, world: int, n_entries: int, groups: dict) -> tuple[bytes, bytes]:
    """One rank's dump as JSON and as pickle (with stack frames)."""
    d = rank_dump(rank, world, n_entries, groups)
    text = json.dumps(d).encode()
    for e in d["entries"]:
        e["process_group"] = tuple(e["process_group"])
        e["time_discovered_started_ns"] = e["time_discovered_started_ns"] or None
        e["time_discovered_completed_ns"] = e["time_discovered_completed_ns"] or None
        e["frames"] = [{"name": "train_step", "filename": "train.py", "line": 120}]
    return text, pickle.dumps(d)


def _names(rank: int, groups: dict) -> list[tuple[bytes, bytes]]:
    """What differs between two ranks' dumps at the same place in their tensor-parallel group and in the
    7-rank timing pattern: the tensor-parallel group's name and member list (as JSON, and as pickled strings)."""
    k = rank // TP
    name, members = f"tp{k}", json.dumps(groups[f"tp{k}"])
    pickled = [b"\x8c" + bytes([len(x)]) + x.encode() for x in (name, members)]
    return [(b'"%s"' % name.encode(), json.dumps(members).encode()), tuple(pickled)]


def _write_ranks(data: Path, world: int, n_entries: int, ranks: range) -> None:
    """Dumps of ranks outside the lost rank's group are the same bytes but for their tensor-parallel group's
    name and members: each is written from a rank of the same kind by replacing those (checked against a full
    generation for the first of every kind, and for every rank of small sets), which makes a 16 384-rank set
    about five times faster to write."""
    groups = layout(world)
    fault_group = fault_rank(world) // TP
    templates: dict[tuple, tuple] = {}
    for rank in ranks:
        if (data / "pickle" / f"rank_{rank}").exists():
            continue  # written by an earlier, interrupted run (the pickle is written last)
        names = _names(rank, groups)
        key = (rank % TP, rank % 7, *(len(x) for x in names[1]))
        got = templates.get(key)
        if rank // TP == fault_group or got is None or world <= 1024:
            text, pickled = _dump_bytes(rank, world, n_entries, groups)
            if rank // TP != fault_group:
                if got is not None:
                    assert _from_template(got, names) == (text, pickled), rank
                templates[key] = (text, pickled, names)
        else:
            text, pickled = _from_template(got, names)
        (data / "json" / f"rank_{rank}.json").write_bytes(text)
        (data / "pickle" / f"rank_{rank}").write_bytes(pickled)


def _from_template(template: tuple, names: list) -> tuple[bytes, bytes]:
    text, pickled, old = template
    for a, b in zip(old[0], names[0]):
        text = text.replace(a, b)
    for a, b in zip(old[1], names[1]):
        pickled = pickled.replace(a, b)
    return text, pickled


def generate(data: Path, world: int, n_entries: int, jobs: int = 1) -> None:
    """Write the dumps once (a stamp file marks a complete set); `jobs` processes write disjoint rank ranges."""
    stamp = data / f".complete_{world}x{n_entries}"
    if stamp.exists():
        return
    (data / "json").mkdir(parents=True, exist_ok=True)
    (data / "pickle").mkdir(parents=True, exist_ok=True)
    if jobs <= 1:
        _write_ranks(data, world, n_entries, range(world))
    else:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(jobs) as pool:
            list(pool.map(_write_ranks, [data] * jobs, [world] * jobs, [n_entries] * jobs,
                          [range(k, world, jobs) for k in range(jobs)]))
    stamp.write_text("ok")


_WRAPPER = """
import json, os, resource, subprocess, sys, threading, time
timeout, out_path, cmd = float(sys.argv[1]), sys.argv[2], sys.argv[3:]


def tree_rss(pid):
    # the resident memory of pid and all its descendants, in bytes (the workers of a streamed load count too)
    total, todo = 0, [pid]
    while todo:
        q = todo.pop()
        try:
            with open(f"/proc/{q}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{q}/task"):
                with open(f"/proc/{q}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            pass
    return total


t = time.perf_counter()
p = subprocess.Popen(cmd, stdout=open(out_path, "wb"), stderr=subprocess.PIPE)
peak = [0]
done = threading.Event()


def sample():
    while not done.wait(0.1):
        peak[0] = max(peak[0], tree_rss(p.pid))


threading.Thread(target=sample, daemon=True).start()
try:
    _, err = p.communicate(timeout=timeout)
    rc, outcome = p.returncode, None
except subprocess.TimeoutExpired:
    p.kill()
    _, err = p.communicate()
    rc, outcome = None, f"timed out after {timeout:.0f} s (killed)"
done.set()
wall = time.perf_counter() - t
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "outcome": outcome, "wall_s": round(wall, 1), "cpu_s": round(r.ru_utime + r.ru_stime, 1),
                  "peak_rss_mb": round(r.ru_maxrss / 1024), "peak_tree_rss_mb": round(peak[0] / 2**20),
                  "stderr": err.decode(errors="replace")[-2000:]}))
"""


def timed_child(cmd: list[str], timeout: float, env: dict | None = None, stdout_path: str = os.devnull) -> dict:
    """Run cmd in a child: wall seconds, CPU seconds (user + sys, all its processes), peak RSS of its largest
    process (ru_maxrss of the waited children), the peak of the sum over the process and its workers (sampled
    every 0.1 s), exit code; killed at `timeout` and still measured."""
    res = subprocess.run([sys.executable, "-c", _WRAPPER, str(timeout), stdout_path, *cmd], capture_output=True,
                         text=True, timeout=timeout + 60, env=env)
    return json.loads(res.stdout)


def drop_from_page_cache(folder: Path) -> None:
    """Evict the set's files from the page cache (their pages are clean: the kernel drops them on this advice)."""
    for p in folder.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--entries", type=int, default=2000)
    ap.add_argument("--data", default="/tmp/distdoctor-diagnose-scale")
    ap.add_argument("--timeout", type=float, default=900, help="limit for distdoctor diagnose (s)")
    ap.add_argument("--torchfrtrace-timeout", type=float, default=900)
    ap.add_argument("--skip-torchfrtrace", action="store_true")
    ap.add_argument("--skip-distdoctor", action="store_true", help="only torchfrtrace (e.g. to rerun it alone)")
    ap.add_argument("--baseline", metavar="CHECKOUT", help="another distdoctor checkout (e.g. a git worktree of an "
                    "older commit): run its diagnose on the same dumps, alternating with this one")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each (alternating with --baseline)")
    ap.add_argument("--gen-jobs", type=int, default=1, help="processes writing the dumps (once per set)")
    ap.add_argument("--form", choices=("json", "pickle"), default="json", help="which dumps distdoctor reads")
    ap.add_argument("--layout", choices=tuple(STEPS), default="tp", help="which groups the collectives run on "
                    "(see above; world: all on the default group)")
    ap.add_argument("--scanner", choices=("on", "off"), default="on",
                    help="on: the C readers built at install; off: the Python reader (as an install without a C "
                    "compiler)")
    ap.add_argument("--generate-only", action="store_true", help="write the dumps and stop")
    ap.add_argument("--cold", action="store_true", help="drop the dumps from the page cache before each run (as "
                    "a set just copied off the cluster, or one larger than the machine's memory, is read)")
    args = ap.parse_args()
    global LAYOUT
    LAYOUT = args.layout
    data = Path(args.data) / (f"{args.ranks}x{args.entries}" + ("" if args.layout == "tp" else f"-{args.layout}"))
    t = time.perf_counter()
    generate(data, args.ranks, args.entries, args.gen_jobs)
    print(f"dumps ready in {time.perf_counter() - t:.1f} s under {data}", file=sys.stderr)
    if args.generate_only:
        return
    report_path = str(data / "report.json")

    def diagnose(checkout: Path, report: str) -> dict:
        if args.cold:
            drop_from_page_cache(data / args.form)
        env = dict(os.environ, PYTHONPATH=str(checkout / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if args.scanner != "on":
            env["DISTDOCTOR_SCANNER"] = args.scanner
        return timed_child([sys.executable, "-m", "distdoctor", "diagnose", str(data / args.form), "--format",
                            "json"], args.timeout, env, report)

    load_before = os.getloadavg()
    runs, baseline_runs = [], []
    for _ in range(0 if args.skip_distdoctor else args.rounds):
        runs.append(diagnose(ROOT, report_path))
        if args.baseline:
            baseline_runs.append(diagnose(Path(args.baseline), str(data / "report.baseline.json")))
    ours = {"rc": None, "outcome": "skipped", "wall_s": float("nan"), "cpu_s": float("nan")} if not runs else \
        dict(sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2])  # the median run
    summary = {"ranks": args.ranks, "entries_per_rank": args.entries, "layout": args.layout,
               "cpus": os.cpu_count(), "form": args.form,
               "scanner": args.scanner, "cold": args.cold, "load_average_before": load_before,
               "bytes": sum(p.stat().st_size for p in (data / args.form).iterdir()), "distdoctor": ours}
    if len(runs) > 1:
        summary["distdoctor_runs"] = [(r["wall_s"], r["cpu_s"], r.get("peak_rss_mb")) for r in runs]
    if baseline_runs:
        base = sorted(baseline_runs, key=lambda r: r["wall_s"])[len(baseline_runs) // 2]
        summary["baseline"] = {"checkout": args.baseline, "median_wall_s": base["wall_s"],
                               "median_cpu_s": base["cpu_s"], "peak_rss_mb": base.get("peak_rss_mb"),
                               "runs": [(r["wall_s"], r["cpu_s"], r.get("peak_rss_mb")) for r in baseline_runs],
                               "same_report": Path(report_path).read_bytes() ==
                               Path(data / "report.baseline.json").read_bytes()}
        summary["ratio_wall_baseline_over_distdoctor"] = round(base["wall_s"] / ours["wall_s"], 2)
    if ours.get("rc") in (0, 1):
        doc = json.loads(Path(report_path).read_text())
        summary["distdoctor"]["findings"] = [(f["kind"], f["ranks"], f["group"], f["seq"], f["op"])
                                             for f in doc["findings"]]
    ours.pop("stderr", None)
    summary["load_average_after"] = os.getloadavg()
    if not args.skip_torchfrtrace:
        theirs = timed_child([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace",
                              str(data / "pickle"), "-p", "rank_"], args.torchfrtrace_timeout)
        if theirs.get("rc") is not None:
            last = ((theirs.get("stderr") or "").strip().splitlines() or [""])[-1]
            theirs["outcome"] = "finished" if theirs["rc"] == 0 else f"exit {theirs['rc']}: {last[:300]}"
        theirs.pop("stderr", None)
        summary["torchfrtrace"] = theirs
        # the machine is shared: CPU seconds compare more fairly than wall seconds; both are reported
        summary["ratio_wall_torchfrtrace_over_distdoctor"] = round(theirs["wall_s"] / ours["wall_s"], 2)
        summary["ratio_cpu_torchfrtrace_over_distdoctor"] = round(theirs["cpu_s"] / max(ours["cpu_s"], 1e-9), 2)
        if theirs.get("rc") is None:
            summary["note"] = "torchfrtrace was killed at its limit: its ratios are lower bounds"
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
