"""`distdoctor bench`: collective bandwidth with nccl-tests' semantics, on any world distdoctor can start.

For each size from -b to -e (x -f): count = size / spec.size_bytes(1 element) (all_to_all rounds it to a
multiple of n, as nccl-tests does); for the out-of-place and the in-place form of the call (where torch has
it): `warmup` untimed calls, a barrier, then `iters` back-to-back calls timed with CUDA events on GPU or
perf_counter on CPU, divided by iters. Each rank times itself; the reported time is the max over ranks
(per-rank times are kept; a synchronizing collective makes every rank wait for the slowest link, so they rarely
point at a slow host: `--links` does, with point-to-point transfers per host pair, in links.py).
algbw = size / time; busbw = algbw * spec.bus_factor(n) (the spec is the one place that states it). With -c,
the buffers are refilled after timing, the call runs once more and the elements off the float64 reference are
counted (#wrong, summed over ranks).
Summary: `# Avg bus bandwidth` = mean busbw over every timed row; `--min-busbw X` fails below X.
With `--links`, the link probe runs after the sweep, in the same world, and adds its fields to the report.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import dataclass

from distdoctor.collectives import SPECS, get_spec
from distdoctor.collectives.base import DTYPES, REDOPS, GroupView, itemsize, tolerance
from distdoctor.errors import InputError
from distdoctor.world import WorldConfig, resolve_nproc, run_job
from distdoctor.world.config import min_world

BENCH_OPS = tuple(name for name, spec in SPECS.items() if spec.has_data)
MAX_LINK_BYTES = 4 << 30  # one message buffer per rank of the link probe


@dataclass
class BenchOptions:
    op: str = "all_reduce"
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    minbytes: int = 1 << 10
    maxbytes: int = 16 << 20
    stepfactor: int = 4
    iters: int = 20
    warmup: int = 5
    check: bool = True
    min_busbw: float | None = None
    seed: int = 0
    links: bool = False  # after the sweep, point-to-point between hosts (links.py)
    link_bytes: int = 4 << 20
    link_iters: int = 10
    per_iter: bool = False  # -I: time every iteration (min/max/p99/cv% per row, like nccl-tests -I)

    def validate(self) -> None:
        if self.op not in SPECS or not SPECS[self.op].has_data:
            raise InputError("--op", f"unknown or data-less collective {self.op!r} (one of {', '.join(BENCH_OPS)})")
        if self.dtype not in DTYPES:
            raise InputError("--dtype", f"unknown dtype {self.dtype!r} (one of {', '.join(DTYPES)})")
        if self.redop not in REDOPS:
            raise InputError("--redop", f"unknown reduction {self.redop!r} (one of {', '.join(REDOPS)})")
        if self.minbytes < 0 or self.maxbytes < 0:
            raise InputError("-b/-e", "sizes must not be negative")
        if self.minbytes == 0:
            raise InputError("-b/--minbytes", "size 0 moves no data, so it has no bandwidth (validate checks count 0)")
        if self.maxbytes < self.minbytes:
            raise InputError("-e/--maxbytes", f"{self.maxbytes} is below -b/--minbytes {self.minbytes}")
        if self.stepfactor < 2 and self.maxbytes > self.minbytes:
            raise InputError("-f/--stepfactor", "must be >= 2 (or give -b equal to -e)")
        if self.iters < 1:
            raise InputError("-n/--iters", "must be >= 1")
        if self.warmup < 0:
            raise InputError("-w/--warmup", "must be >= 0")
        if self.root < 0:
            raise InputError("--root", "must be >= 0")
        if not 4 <= self.link_bytes <= MAX_LINK_BYTES:
            raise InputError("--link-bytes", f"must be from one float32 element (4 B) to {MAX_LINK_BYTES >> 30} GiB, "
                                             f"got {self.link_bytes}")
        if self.link_iters < 1:
            raise InputError("--link-iters", "must be >= 1")

    def sizes(self) -> list[int]:
        out, size = [], self.minbytes
        while size <= self.maxbytes:
            out.append(size)
            if self.stepfactor < 2:
                break
            size = size * self.stepfactor if size else 1
        return out

    def worker_args(self) -> dict:
        args = {"op": self.op, "dtype": self.dtype, "redop": self.redop, "root": self.root, "sizes": self.sizes(),
                "iters": self.iters, "warmup": self.warmup, "check": self.check, "seed": self.seed}
        if self.per_iter:  # only when asked: check and older callers pass the arguments above
            args["per_iter"] = True
        return args


def count_for(op: str, size_bytes: int, dtype: str, n: int) -> int:
    """nccl-tests: the per-rank count whose size column is at most size_bytes."""
    spec = get_spec(op)
    per_element = spec.size_bytes(1, itemsize(dtype), n)
    count = size_bytes // per_element if per_element else 0
    timed = next(v for v in spec.bench_variants(n, "sum", 0).values() if v is not None)
    return spec.effective_count(count, n, timed)  # all_to_all's even split: a multiple of n, as nccl-tests rounds


def _warm_up(call, warmup: int, group, device) -> bool:
    """Untimed calls, then a barrier so that every rank starts timing together; True on a CUDA device."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        call()
    cuda = device is not None and getattr(device, "type", str(device)).startswith("cuda")
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier(group=group)
    return cuda


def time_call(call, iters: int, warmup: int, group, device) -> float:
    """Seconds per call on this rank: warmup, barrier, then iters back-to-back calls, nothing else timed."""
    import torch

    if _warm_up(call, warmup, group, device):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - t0) / iters


def time_iterations(call, iters: int, warmup: int, group, device) -> list[float]:
    """Seconds of each of `iters` calls on this rank (warmup, barrier, then each call timed on its own: CUDA
    events around every call on GPU, perf_counter on CPU, where a gloo call returns when it is done)."""
    import torch

    if _warm_up(call, warmup, group, device):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, stop in events:
            start.record()
            call()
            stop.record()
        events[-1][1].synchronize()
        return [start.elapsed_time(stop) / 1e3 for start, stop in events]
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def count_wrong(spec, variant, prepared, count: int, dtype: str, seed: int, gv: GroupView) -> int:
    """Refill, run once, count this rank's elements off the float64 reference (beyond the dtype tolerance)."""
    import torch

    prepared.refill()
    prepared.call()
    out = prepared.output()
    expected = spec.expected(variant, count, seed, gv.members, gv.rank)
    if out is None or expected is None:
        return 0
    actual = out.detach().cpu().to(torch.float64)
    if actual.shape != expected.shape:
        return max(actual.numel(), expected.numel())
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    diff = (actual - expected).abs()
    return int((~(diff <= tolerance(dtype, scale, gv.size))).sum())


_SUPPORT_CACHE: dict[tuple, dict] = {}


def bench_worker(ctx, op, dtype, redop, root, sizes, iters, warmup, check, seed=0, per_iter=False) -> dict:
    """Runs on every rank (via run_job): times every (size, in-place?) row; rows also go out via ctx.emit."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    from distdoctor.validate.execute import Case, Size, probe_support

    n = ctx.world_size
    spec = get_spec(op)
    gv = GroupView(tuple(range(n)), ctx.rank, None)
    rows = []
    # A combination the backend cannot do (gloo: integer AVG) can break the group it runs on: try it on a
    # scratch group first and report it instead of timing it.
    variants = [v for v in spec.bench_variants(n, redop, root % n).values() if v is not None]
    key = (op, dtype, tuple(variants), n, ctx.backend)
    if key not in _SUPPORT_CACHE:  # once per process: every rank calls bench_worker the same way
        _SUPPORT_CACHE[key] = probe_support(
            ctx, [Case(i, "world", op, v, dtype, Size(1, False)) for i, v in enumerate(variants)], seed)
    unsupported = _SUPPORT_CACHE[key]
    if unsupported:
        reason = next(iter(unsupported.values()))
        ctx.emit({"kind": "bench_unsupported", "op": op, "dtype": dtype, "reason": reason})
        return {"rows": [], "host": socket.gethostname(), "unsupported": reason}
    for i, size in enumerate(sizes):
        count = count_for(op, size, dtype, n)
        if count == 0:
            continue  # smaller than one element per rank: nothing to time
        for inplace, variant in sorted(spec.bench_variants(n, redop, root % n).items()):
            if variant is None:
                continue
            with ctx.phase(f"bench {op} {dtype} {size} B {'in-place' if inplace else 'out-of-place'}"):
                prepared = spec.prepare(variant, count, dtype, seed, gv, ctx.device)
                if per_iter:
                    iter_s = time_iterations(prepared.call, iters, warmup, None, ctx.device)
                    seconds = sum(iter_s) / len(iter_s)
                else:
                    iter_s, seconds = None, time_call(prepared.call, iters, warmup, None, ctx.device)
                wrong = count_wrong(spec, variant, prepared, count, dtype, seed, gv) if check else None
            row = {"kind": "bench", "op": op, "dtype": dtype, "size_bytes": spec.size_bytes(count, itemsize(dtype), n),
                   "count": count, "inplace": inplace, "time_s": seconds, "wrong": wrong, "rank": ctx.rank}
            if iter_s is not None:
                row["iter_s"] = iter_s
            ctx.emit(row)
            rows.append(row)
        ctx.progress(i + 1, len(sizes), f"{size} B")
    return {"rows": rows, "host": socket.gethostname(), "pid": os.getpid(),
            "device": ctx.device.index if getattr(ctx.device, "type", "cpu") == "cuda" else -1}


def bench_and_links(ctx, links: dict, **bench_args) -> dict:
    """`bench --links`: the sweep, then the point-to-point link probe, in the same world."""
    from distdoctor.bench.links import links_worker

    out = bench_worker(ctx, **bench_args)
    out["links"] = links_worker(ctx, **links)
    return out


def summarize_bench(job, opts: BenchOptions) -> dict:
    """Fold a JobResult of bench_worker into the bench JSON contract (time = max over ranks)."""
    n = job.world_size
    spec = get_spec(opts.op)
    per_key: dict[tuple, dict[int, dict]] = {}
    for rank, records in job.records.items():
        for rec in records:
            if rec.get("kind") == "bench" and rec.get("op", opts.op) == opts.op and \
                    rec.get("dtype", opts.dtype) == opts.dtype:
                per_key.setdefault((rec["size_bytes"], rec["count"], rec["inplace"]), {})[rank] = rec
    unsupported = sorted({rec["reason"] for records in job.records.values() for rec in records
                          if rec.get("kind") == "bench_unsupported" and rec.get("op") == opts.op
                          and rec.get("dtype") == opts.dtype})
    rows = []
    for (size, count, inplace), recs in sorted(per_key.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if len(recs) < n:
            continue  # a rank died before timing this row: no honest max over ranks
        per_rank = [recs[r]["time_s"] * 1e6 for r in range(n)]
        time_us = max(per_rank)
        algbw = size / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
        wrong = None if not opts.check else sum(recs[r]["wrong"] or 0 for r in range(n))
        rows.append({"op": opts.op, "size_bytes": size, "count": count, "dtype": opts.dtype, "inplace": inplace,
                     "time_us": time_us, "algbw_gbps": algbw, "busbw_gbps": algbw * spec.bus_factor(n),
                     "wrong": wrong, "redop": opts.redop if spec.reduces else None,
                     "root": opts.root % n if spec.rooted else None, "per_rank_time_us": per_rank,
                     "slowest_rank": per_rank.index(time_us)})
        if all("iter_s" in recs[r] for r in range(n)):
            from distdoctor.bench.nccl_tests import iteration_stats

            rows[-1]["per_iter"] = iteration_stats([[t * 1e6 for t in recs[r]["iter_s"]] for r in range(n)])
    avg = statistics.fmean(r["busbw_gbps"] for r in rows) if rows else 0.0
    hosts = {r: (v or {}).get("host") for r, v in job.results.items()}
    lost = [{"rank": lr.rank, "host": lr.host, "reason": lr.reason, "in_op": lr.in_op} for lr in job.lost]
    wrong_total = sum(r["wrong"] or 0 for r in rows)
    failed_reasons = []
    if lost:
        failed_reasons.append("lost " + ", ".join(f"rank {x['rank']}" for x in lost))
    if wrong_total:
        failed_reasons.append(f"{wrong_total} wrong elements")
    if opts.min_busbw is not None and avg < opts.min_busbw:
        failed_reasons.append(f"average bus bandwidth {avg:.3g} GB/s is below --min-busbw {opts.min_busbw:g}")
    failed_reasons += [f"{opts.op} {opts.redop} {opts.dtype}: {why}" for why in unsupported]
    if not rows and not unsupported:
        failed_reasons.append("no row was measured")
    return {"world_size": n, "backend": job.backend, "device": job.device, "iface": job.iface, "rows": rows,
            "avg_busbw_gbps": avg,
            "op": opts.op, "dtype": opts.dtype, "iters": opts.iters, "warmup": opts.warmup,
            "min_busbw_gbps": opts.min_busbw, "passed": not failed_reasons, "failures": failed_reasons,
            "rank_hosts": {str(k): v for k, v in sorted(hosts.items())}, "lost": lost,
            "rank_pids": {str(r): (v or {}).get("pid") for r, v in sorted(job.results.items())},
            "rank_devices": {str(r): (v or {}).get("device") for r, v in sorted(job.results.items())},
            "per_rank_time_us": per_rank_summary(rows, n)}


def check_root(opts: BenchOptions, n: int) -> None:
    """A root outside the world is refused, never wrapped around (root 7 of 4 ranks is not root 3)."""
    if get_spec(opts.op).rooted and opts.root >= n:
        raise InputError("-r/--root", f"rank {opts.root} does not exist in a world of {n} ranks "
                                      f"({opts.op} needs a root from 0 to {n - 1})")


def rank_bytes(op: str, size_bytes: int, dtype: str, n: int, check: bool) -> int:
    """Host memory one rank needs at its peak for one row (an estimate that errs high): the call's input and
    output buffers, the float64 values the input is cast from, and with -c the float64 reference (built from
    every member's input), the output read back and its difference from the reference."""
    spec = get_spec(op)
    count = count_for(op, size_bytes, dtype, n)
    out = spec.out_numel(count, n)
    verify = (2 * max(count, out) + 3 * out) * 8 if check else 0
    return (count + out) * itemsize(dtype) + max(count * 8, verify)


def available_memory() -> int | None:
    """Bytes the kernel says can be allocated without swapping (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(opts: BenchOptions, n: int, cfg: WorldConfig) -> None:
    """Refuse a sweep whose largest buffers cannot fit, with the numbers, instead of running until the kernel
    kills a rank. Every rank of this host needs its buffers at once (a GPU world: its reference on the host)."""
    from distdoctor.world.launchers import detect

    avail = available_memory()
    if avail is None:
        return
    launch = detect()
    local = (launch.local_world_size or launch.world_size) if launch else n
    need = rank_bytes(opts.op, opts.maxbytes, opts.dtype, n, opts.check)
    if need * local <= avail:
        return
    fits = [s for s in opts.sizes() if rank_bytes(opts.op, s, opts.dtype, n, opts.check) * local <= avail]
    advice = f"use -e {fits[-1]} or less" if fits else "no size of this sweep fits"
    raise InputError("-e/--maxbytes", f"{opts.maxbytes} B of {opts.op} {opts.dtype} needs about {_gib(need)} per "
                                      f"rank x {local} ranks on this host = {_gib(need * local)}, but "
                                      f"{_gib(avail)} is available (MemAvailable): {advice}")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def per_rank_summary(rows: list[dict], n: int) -> dict:
    """Each rank's time relative to the median rank, over the rows (>1 = slower): points at a slow host."""
    if not rows:
        return {}
    ratios: dict[int, list[float]] = {r: [] for r in range(n)}
    for row in rows:
        med = statistics.median(row["per_rank_time_us"])
        for r, t in enumerate(row["per_rank_time_us"]):
            ratios[r].append(t / med if med > 0 else 1.0)
    return {str(r): round(statistics.median(v), 3) for r, v in ratios.items()}


def run_bench(cfg: WorldConfig, opts: BenchOptions, on_event=None, baseline: dict | None = None,
              tolerance_pct: float = 10.0) -> dict | None:
    """Run the sweep (and --links); `baseline` (baseline.load_baseline): compare and fail the sizes below it."""
    opts.validate()
    n = resolve_nproc(cfg)
    if n is not None and n < min_world(cfg.backend):
        raise InputError("--nproc", "bench needs a world of at least 2 ranks (one GPU with --backend nccl)")
    if n is not None:
        check_root(opts, n)
        check_memory(opts, n, cfg)
    if opts.links:
        job = run_job("distdoctor.bench.sweep:bench_and_links",
                      {"links": {"nbytes": opts.link_bytes, "iters": opts.link_iters}, **opts.worker_args()}, cfg,
                      on_event=on_event)
    else:
        job = run_job("distdoctor.bench.sweep:bench_worker", opts.worker_args(), cfg, on_event=on_event)
    if not job.is_reporter:
        return None
    report = summarize_bench(job, opts)
    if opts.links:
        from distdoctor.bench.links import link_failures, summarize_links

        report.update(summarize_links(job, opts.link_bytes, opts.link_iters))
        report["failures"] += link_failures(report)
        report["passed"] = not report["failures"]
    if baseline is not None:
        from distdoctor.bench.baseline import compare

        report["baseline"] = compare(report, baseline, tolerance_pct)
        report["failures"] += report["baseline"]["failures"]
        report["passed"] = not report["failures"]
    return report
