"""The rank-side half of validate: the call plan, size parsing, mesh groups and the loop that runs the calls.

Kept apart from `sweep.py` (options, summary) so `check` and tests can reuse the loop, and so the plan is one
pure function of (options, world size) that every rank and the reporter compute identically.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

from distdoctor import options
from distdoctor.collectives import get_spec
from distdoctor.collectives.base import GroupView, Variant, itemsize, tolerance
from distdoctor.errors import InputError
from distdoctor.world.failures import is_comm_failure, is_unsupported
from distdoctor.world.faults import CRASH_EXIT_CODE, Fault


@dataclass(frozen=True)
class Size:
    value: int
    is_bytes: bool

    def count(self, dtype: str | None) -> int:
        return self.value // itemsize(dtype) if self.is_bytes and dtype else self.value

    def __str__(self) -> str:
        return f"{self.value}B" if self.is_bytes else str(self.value)


def parse_size(text: str, what: str = "--sizes", force_bytes: bool = False) -> Size:
    """'1023' (elements), '1M' (2^20 elements), '1MiB'/'1MB'/'4096B' (bytes). force_bytes: plain = bytes."""
    return Size(*options.parse_size(text, what, force_bytes))


def parse_sizes(text: str) -> list[Size]:
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise InputError("--sizes", "no size given")
    return [parse_size(p) for p in parts]


def mesh_groups(n: int) -> dict[str, list[list[int]]]:
    """The world plus, for an even n >= 4, an (n/2) x 2 mesh as HSDP uses: 'shard' = pairs of neighbours,
    'replicate' = the ranks at the same position in every pair."""
    groups = {"world": [list(range(n))]}
    if n >= 4 and n % 2 == 0:
        groups["shard"] = [[i, i + 1] for i in range(0, n, 2)]
        groups["replicate"] = [list(range(j, n, 2)) for j in range(2)]
    return groups


@dataclass(frozen=True)
class Case:
    index: int
    group: str  # "world" | "shard" | "replicate"
    op: str
    variant: Variant
    dtype: str | None
    size: Size | None

    @property
    def count(self) -> int | None:
        return self.size.count(self.dtype) if self.size is not None else None

    @property
    def count_label(self) -> str:
        return str(self.size) if self.size is not None else "-"

    def label(self) -> str:
        what = f"{self.op} {self.variant.label()}"
        if self.dtype:
            what += f" {self.dtype} count={self.count}"
        return f"#{self.index + 1} {what} on {self.group}"


def plan_cases(ops, dtypes, sizes, redops, subgroups: bool, n: int) -> list[Case]:
    """Every call validate makes, in the order every rank makes them."""
    size_list = parse_sizes(sizes) if isinstance(sizes, str) else list(sizes)
    groups = mesh_groups(n) if subgroups else {"world": [list(range(n))]}
    cases: list[Case] = []
    for gname, instances in groups.items():
        gsize = len(instances[0])
        for op in ops:
            spec = get_spec(op)
            for variant in spec.variants(gsize):
                if variant.redop is not None and variant.redop not in redops:
                    continue
                if not spec.has_data:
                    cases.append(Case(len(cases), gname, spec.name, variant, None, None))
                    continue
                for dtype in dtypes:
                    for size in size_list:
                        cases.append(Case(len(cases), gname, spec.name, variant, dtype, size))
    return cases


def _digest(t) -> str:
    import torch

    raw = t.detach().contiguous().cpu().reshape(-1)
    if raw.numel() == 0:
        return "empty"
    return hashlib.blake2b(raw.view(torch.uint8).numpy().tobytes(), digest_size=12).hexdigest()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


class FaultPlan:
    """The faults (world/faults.py) that hit this rank, planted around each collective by the loop below."""

    def __init__(self, faults: list[dict] | list[Fault], rank: int):
        self.faults = [f if isinstance(f, Fault) else Fault(**f) for f in faults]
        self.rank = rank

    def _hit(self, kind: str, nth: int) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind and f.applies(self.rank, nth)), None)

    def should_skip(self, nth: int) -> bool:
        return self._hit("skip", nth) is not None

    def before(self, nth: int) -> None:
        """Called before this rank's nth collective (1-based): crash or sleep."""
        if self._hit("crash", nth):
            os._exit(CRASH_EXIT_CODE)  # no cleanup, no goodbye: like a killed process
        delay = self._hit("delay", nth)
        if delay:
            time.sleep(delay.arg)

    def after(self, nth: int, output) -> None:
        """Called with this rank's output tensor after its nth collective: corrupt it in place."""
        if output is None or output.numel() == 0 or not self._hit("corrupt", nth):
            return
        flat = output.view(-1)
        i = flat.numel() // 2
        flat[i] = flat[i] + 1 + flat[i].abs()  # far outside any tolerance, representable in every dtype


# A rank can run ahead of a straggler in another subgroup instance by at most this many cases.
LOCKSTEP_EVERY = 8


def run_cases(ctx, cases: list[Case], seed: int, faults: list[dict]) -> dict:
    """Run `cases` on this rank; each result goes out through ctx.emit (it survives a later crash)."""
    import warnings

    import torch
    import torch.distributed as dist

    # torch 2.13 deprecates the *_into_tensor/_tensor names validate checks on purpose.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    rank, n, device = ctx.rank, ctx.world_size, ctx.device
    plan = FaultPlan(faults, rank)
    # Every rank creates every group, in the same order (torch requires it), then keeps its own.
    mine: dict[str, GroupView] = {}
    for gname, instances in mesh_groups(n).items():
        if not any(c.group == gname for c in cases):
            continue
        for members in instances:
            handle = None if gname == "world" else ctx.new_group(members)
            if rank in members:
                mine[gname] = GroupView(tuple(members), members.index(rank), handle)
    unsupported = probe_support(ctx, cases, seed)
    # Lockstep: every LOCKSTEP_EVERY-th subgroup case starts with a barrier of the whole world, on a group of its
    # own (so that it never pairs with a checked call). Without it, the ranks of one subgroup instance run ahead
    # of a slow rank in another, then wait for it in a later case for longer than the timeout: a straggler would
    # be reported lost. World cases keep every rank in step by themselves.
    lockstep = ctx.new_group(list(range(n))) if any(c.group != "world" for c in cases) else None
    counts = {"pass": 0, "wrong": 0, "skipped": 0, "error": 0}
    for nth, case in enumerate(cases, start=1):
        if lockstep is not None and case.group != "world" and nth % LOCKSTEP_EVERY == 0:
            with ctx.phase(case.label()):
                dist.barrier(group=lockstep)
        if plan.should_skip(nth):
            continue  # the fault: this rank never enters this call
        ctx.emit({"kind": "enter", "i": case.index})
        with ctx.phase(case.label()):
            plan.before(nth)
            why = unsupported.get(_support_key(case))
            if why:
                rec = {"kind": "case", "i": case.index, "rank": rank, "members": list(mine[case.group].members),
                       "count": case.count or 0, "status": "skipped", "reason": why, "err": None, "ok": True,
                       "hash": None, "ref_hash": None, "wait": None, "tol": 0.0}
            else:
                rec = _run_one(case, mine[case.group], seed, device, plan, nth, rank, dist, torch)
        counts[rec["status"] if rec["status"] != "ok" else ("pass" if rec["ok"] else "wrong")] += 1
        ctx.emit(rec)
        ctx.progress(nth, len(cases), case.op)
    return {"cases": len(cases), **counts}


def _support_key(case: Case) -> tuple:
    v = case.variant
    return (case.op, v.form, v.inplace, v.redop, case.dtype)


def probe_support(ctx, cases: list[Case], seed: int) -> dict[tuple, str]:
    """Which (op, form, in-place, redop, dtype) the backend cannot do, found by trying each once.

    A failed try can leave a gloo group unusable (integer AVG closes its connections), so probes run on a
    scratch group of the whole world with a short timeout, replaced after every failure; the ranks then
    agree on the outcome over the world group (a rank that only saw its peer fail adopts the peer's reason).
    """
    import datetime

    import torch.distributed as dist

    keys = []
    for c in cases:
        if c.dtype is not None and _support_key(c) not in keys:
            keys.append(_support_key(c))
    if not keys:
        return {}
    n, rank = ctx.world_size, ctx.rank
    timeout = datetime.timedelta(seconds=min(10.0, ctx.timeout.total_seconds()))

    def scratch():
        return GroupView(tuple(range(n)), rank, dist.new_group(list(range(n)), timeout=timeout))

    gv = scratch()
    mine: dict = {}
    with ctx.phase("probing which ops and dtypes the backend supports"):
        for key in keys:
            op, form, inplace, redop, dtype = key
            spec = get_spec(op)
            variant = Variant(form=form, inplace=inplace, redop=redop, root=0 if spec.rooted else None)
            try:
                prepared = spec.prepare(variant, n, dtype, seed, gv, ctx.device)
                prepared.call()
                dist.barrier(group=gv.handle)
            except Exception as exc:  # noqa: BLE001 - any failure means "not supported here"
                mine[key] = _first_line(exc)
                gv = scratch()
        everyone: list = [None] * n
        dist.all_gather_object(everyone, sorted(mine.items()))
    merged: dict[tuple, str] = {}
    for entries in everyone:
        for key, why in entries:
            key = tuple(key)
            if key not in merged or (is_comm_failure(merged[key]) and not is_comm_failure(why)):
                merged[key] = why
    return {key: f"not supported by {ctx.backend}: {why}" for key, why in merged.items()}


def _run_one(case: Case, gv: GroupView, seed, device, plan: FaultPlan, nth: int, rank: int, dist, torch) -> dict:
    spec = get_spec(case.op)
    rec = {"kind": "case", "i": case.index, "rank": rank, "members": list(gv.members), "count": 0,
           "status": "ok", "reason": "", "err": None, "tol": 0.0, "ok": True, "hash": None, "ref_hash": None,
           "wait": None}
    count = case.count or 0
    try:
        prepared = spec.prepare(case.variant, count, case.dtype or "float32", seed, gv, device)
        expected = spec.expected(case.variant, count, seed, gv.members, gv.rank)
    except Exception as exc:  # building buffers of an unsupported dtype on this device
        rec.update(status="skipped", reason=_first_line(exc))
        return rec
    rec["count"] = prepared.count
    t0 = time.monotonic()
    dist.barrier(group=gv.handle)
    rec["wait"] = time.monotonic() - t0
    try:
        prepared.call()
        # Gloo may raise a call's error (e.g. AVG on integers) only at the next wait: fence it into this case.
        dist.barrier(group=gv.handle)
    except Exception as exc:
        msg = _first_line(exc)
        if is_comm_failure(msg) and not is_unsupported(msg):
            raise  # the world is broken: let the launcher report this rank and where it was
        rec.update(status="skipped" if is_unsupported(msg) else "error", reason=msg)
        return rec
    out = prepared.output()
    if out is not None and device is not None and str(device).startswith("cuda"):
        torch.cuda.synchronize()
    if out is not None:
        out = out.clone()
    plan.after(nth, out)
    if expected is None or out is None:
        return rec
    actual = out.detach().cpu().to(torch.float64)
    if actual.shape != expected.shape:
        rec.update(ok=False, err=float("inf"), reason=f"output has {actual.numel()} elements, {expected.numel()} expected")
        return rec
    diff = (actual - expected).abs()
    err = float(diff.max()) if diff.numel() else 0.0
    if err != err:  # NaN
        err = float("inf")
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    rec["tol"] = tolerance(case.dtype, scale, gv.size)
    rec["err"] = err
    rec["ok"] = err <= rec["tol"]
    rec["hash"] = _digest(out)
    ref = expected.to(out.dtype)
    if torch.equal(ref.to(torch.float64), expected):  # the reference is exactly representable: compare bits
        rec["ref_hash"] = _digest(ref)
    return rec
