"""The recorder at 16 384 ranks: how long every rank takes to dump on a hang, flat directory against one per host.

    python benchmarks/recorder_dump_scale.py                 # the figures in docs/benchmarks.md
    python benchmarks/recorder_dump_scale.py --ranks 2048    # quicker

Every dump is written by the recorder's own code (`Recorder.dump`: snapshot of the ring and all thread stacks,
`model.dumps`, `write_atomic` with its fsyncs, the path from recorder/layout.py) from a real recorder: each writer
process starts a one-rank gloo group, records calls through a three-frame call chain, then plays one simulated
rank after another (its rank number and its host's name, 8 ranks per host).

1. One rank's dump at the default buffer (2000 calls, stacks on): CPU, wall and bytes, the mean of `--samples`
   dumps. On a cluster every rank dumps on its own core at the same time, so this is the time for a rank.
2. All ranks at once: `--writers` processes write `--ranks` dumps (each `--entries-at-scale` calls, small so that
   16 384 files fit the disk and the two cores: the file system's work per file, not serialization, is what a
   directory layout changes) into a fresh directory, flat and per-host alternately for `--rounds` rounds:
   wall from a common start to the last file, files/s, and the same with the dump bytes prepared beforehand
   (`write_atomic` alone: the file system's part).
This machine's disk is local; a shared file system's metadata server (where one directory's lock is the
bottleneck) cannot be measured here: docs/recorder.md says what the layout is for.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))  # also in the spawned writers, which import this module afresh
RANKS_PER_HOST = 8


def _host(rank: int) -> str:
    return f"node{rank // RANKS_PER_HOST:05d}"


def _start_recorder(entries: int, dump_dir: str):
    """A real recorder in a one-rank gloo group with `entries` calls in its ring."""
    import torch
    import torch.distributed as dist

    import distdoctor.recorder as recorder

    rec = recorder.enable(dump_dir=dump_dir, hang_timeout=0, buffer_size=max(entries, 1), suspect_floor=0)
    store = dist.FileStore(tempfile.mktemp(prefix="dd-bench-store-"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    x = torch.ones(256)

    def layer():
        dist.all_reduce(x)

    def step(n):
        for _ in range(n):
            layer()

    step(entries)
    return rec


def _play(rec, rank: int, world: int, dump_dir: str, layout: str) -> str | None:
    rec.config = dataclasses.replace(rec.config, dump_dir=dump_dir, layout=layout)
    rec.rank, rec.world_size = rank, world
    socket.gethostname = lambda: _host(rank)  # this process plays rank `rank` on its host
    return rec.dump(f"hang: collective pending for 300.0 s (rank {rank} of {world})")


def _writer(wid: int, n_writers: int, args, jobs, barrier, results) -> None:
    real_host = socket.gethostname
    rec = _start_recorder(args.entries_at_scale, args.scratch)
    from distdoctor.recorder.dumpfile import write_atomic

    mine = list(range(wid, args.ranks, n_writers))
    path = _play(rec, mine[0], args.ranks, args.scratch, "flat")  # a real dump's bytes, for the write-only runs
    prepared = Path(path).read_bytes()
    os.unlink(path)
    socket.gethostname = real_host
    while True:
        job = jobs.get()
        if job is None:
            break
        kind, layout, dump_dir = job
        barrier.wait()
        c0, t0 = time.process_time(), time.time()
        if kind == "dump":
            for r in mine:
                _play(rec, r, args.ranks, dump_dir, layout)
        else:  # the file system's part: the same path and write_atomic, bytes ready
            from distdoctor.recorder import layout as layouts

            made = set()
            for r in mine:
                d = layouts.rank_dir(dump_dir, layouts.resolve(layout, args.ranks), _host(r))
                if d not in made:
                    os.makedirs(d, mode=0o700, exist_ok=True)
                    made.add(d)
                write_atomic(os.path.join(d, f"rank_{r}.jsonl"), prepared)
        results.put((wid, time.time(), time.process_time() - c0, t0))
        barrier.wait()


def one_rank(samples: int, scratch: str) -> dict:
    """Phase 1 in a child process (its own recorder at the default buffer)."""
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_one_rank_child, args=(samples, scratch, q))
    p.start()
    try:
        return q.get(timeout=600)
    finally:
        p.join(60)


def _one_rank_child(samples: int, scratch: str, q) -> None:
    from distdoctor.recorder.config import DEFAULT_BUFFER

    rec = _start_recorder(DEFAULT_BUFFER, scratch)
    cpu, wall, size = [], [], 0
    for k in range(samples):
        c0, w0 = time.process_time(), time.perf_counter()
        path = _play(rec, k, 16384, scratch, "host")
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
        size = os.path.getsize(path)
        os.unlink(path)
    q.put({"entries": DEFAULT_BUFFER, "cpu_s": sum(cpu) / samples, "wall_s": sum(wall) / samples,
           "min_wall_s": min(wall), "bytes": size})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--writers", type=int, default=8, help="writer processes (ranks are dealt round-robin)")
    ap.add_argument("--entries-at-scale", type=int, default=32, help="calls per dump in the all-ranks runs")
    ap.add_argument("--samples", type=int, default=10, help="dumps averaged for one rank's figure")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--dir", default=None, help="scratch directory (default: a new one under /tmp)")
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="dd-dump-scale-"))
    base.mkdir(parents=True, exist_ok=True)
    args.scratch = str(base / "scratch")
    print(f"# {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"load average at start {os.getloadavg()[0]:.1f}; scratch {base}")

    one = one_rank(args.samples, args.scratch)
    print(f"\nOne rank's dump, {one['entries']} calls with stacks (mean of {args.samples}): "
          f"{one['wall_s'] * 1e3:.0f} ms wall ({one['min_wall_s'] * 1e3:.0f} ms best), "
          f"{one['cpu_s'] * 1e3:.0f} ms CPU, {one['bytes'] / 1e6:.2f} MB")

    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    barrier = ctx.Barrier(args.writers)
    procs = [ctx.Process(target=_writer, args=(w, args.writers, args, jobs, barrier, results))
             for w in range(args.writers)]
    for p in procs:
        p.start()
    rows = []
    try:
        for rnd in range(args.rounds):
            for kind in ("dump", "write"):
                for layout in (("flat", "host") if rnd % 2 == 0 else ("host", "flat")):
                    target = base / f"{kind}-{layout}-{rnd}"
                    for _ in procs:
                        jobs.put((kind, layout, str(target)))
                    got = [results.get(timeout=3600) for _ in procs]
                    start = min(g[3] for g in got)
                    wall = max(g[1] for g in got) - start
                    files = sum(len(fs) for _, _, fs in os.walk(target))
                    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(target) for f in fs)
                    rows.append({"kind": kind, "layout": layout, "round": rnd, "wall_s": wall, "files": files,
                                 "bytes": size, "cpu_s": sum(g[2] for g in got)})
                    print(f"  {kind:5} {layout:4} round {rnd}: {files} files, {size / 1e6:.0f} MB in {wall:.2f} s "
                          f"({files / wall:,.0f} files/s; writers' CPU {rows[-1]['cpu_s']:.1f} s)", flush=True)
                    shutil.rmtree(target)
    finally:
        for _ in procs:
            jobs.put(None)
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
        shutil.rmtree(base, ignore_errors=True)

    print(f"\n{args.ranks} ranks, {args.writers} writer processes, {RANKS_PER_HOST} ranks per host, dumps of "
          f"{args.entries_at_scale} calls; best of {args.rounds} round(s):\n")
    print("| what | layout | files | wall s | files/s |")
    print("|---|---|---:|---:|---:|")
    for kind in ("dump", "write"):
        for layout in ("flat", "host"):
            best = min((r for r in rows if r["kind"] == kind and r["layout"] == layout), key=lambda r: r["wall_s"])
            print(f"| {'Recorder.dump (serialize + write)' if kind == 'dump' else 'write_atomic alone'} | "
                  f"{layout} | {best['files']} | {best['wall_s']:.2f} | {best['files'] / best['wall_s']:,.0f} |")
    for kind in ("dump", "write"):
        f = min(r["wall_s"] for r in rows if r["kind"] == kind and r["layout"] == "flat")
        h = min(r["wall_s"] for r in rows if r["kind"] == kind and r["layout"] == "host")
        print(f"ratio host/flat ({kind}): {h / f:.3f}")
    print(f"Load average at the end {os.getloadavg()[0]:.1f}.")


if __name__ == "__main__":
    main()
