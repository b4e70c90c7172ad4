"""`distdoctor validate`: run every collective spec on real processes and check each result exactly.

Plan (identical on every rank, so every rank takes part in every group creation and every call in the same
order): groups x ops x variants (form, in-place, reduction op, root) x dtypes x sizes. Groups: the world and,
when the world has >= 4 ranks and an even size, the two axes of a (n/2) x 2 mesh as HSDP builds it: "shard"
groups of 2 neighbours and "replicate" groups of the ranks at the same shard position.

Per call, on each rank (`validate_worker`):
1. build inputs (deterministic from seed, op, variant, group, rank) and the float64 expected output;
2. wait at a barrier on the group and time that wait: everyone leaves together, so -wait is the rank's arrival
   on a clock shared within the call (no clock sync across hosts), which the one straggler rule judges;
3. run the torch.distributed call (combinations the backend cannot do were found beforehand by trying each
   once on a scratch group, and are `skipped` with the backend's error); a communication error propagates
   (the world reports the rank lost and the collective it was in);
4. record max |actual - expected|, a hash of the output bytes, and the lateness data via `ctx.emit`, which
   survives a later crash of the rank. Each call is announced (`enter`) before it starts, so a rank that
   skips a call shows up as a gap in its sequence.
`summarize_validate` (rank 0 / the reporter) folds the per-rank records into one row per
(group, op, variant, dtype, count): max error vs the per-dtype tolerance, bit-identical outputs across the
group (replicated ops) or bit-exact to the reference (the others), and names culprit ranks: the wrong ones,
the odd hash, the late arrivers, the ranks whose sequence has a gap, and the lost ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.collectives import SPECS, get_spec
from distdoctor.collectives.base import DTYPES, REDOPS
from distdoctor.errors import InputError
from distdoctor.validate.execute import Case, parse_sizes, plan_cases, run_cases
from distdoctor.world import WorldConfig, resolve_nproc, run_job
from distdoctor.world.config import min_world
from distdoctor.world.blame import is_vague
from distdoctor.world.faults import parse_faults
from distdoctor.world.lateness import late_ranks

DEFAULT_SIZES = "0,1,1023,1MiB"
VALIDATE_OPS = tuple(SPECS)


@dataclass
class ValidateOptions:
    ops: tuple[str, ...] = VALIDATE_OPS
    dtypes: tuple[str, ...] = DTYPES
    sizes: str = DEFAULT_SIZES
    seed: int = 0
    inject: tuple[str, ...] = ()
    redops: tuple[str, ...] = REDOPS
    subgroups: bool = True
    straggler_s: float = 0.1  # a rank whose median lateness is at least this is a straggler

    def check(self) -> None:
        """Raise InputError (one line) for anything a worker would choke on."""
        for op in self.ops:
            if op not in SPECS:
                raise InputError("--ops", f"unknown op {op!r} (one of {', '.join(SPECS)})")
        for dt in self.dtypes:
            if dt not in DTYPES:
                raise InputError("--dtypes", f"unknown dtype {dt!r} (one of {', '.join(DTYPES)})")
        for r in self.redops:
            if r not in REDOPS:
                raise InputError("--redops", f"unknown reduction {r!r} (one of {', '.join(REDOPS)})")
        parse_sizes(self.sizes)
        parse_faults(self.inject)
        if self.straggler_s <= 0:
            raise InputError("--straggler-threshold", "must be > 0 seconds")

    def worker_args(self) -> dict:
        return {"ops": list(self.ops), "dtypes": list(self.dtypes), "sizes": self.sizes, "seed": self.seed,
                "redops": list(self.redops), "subgroups": self.subgroups,
                "faults": [f.to_dict() for f in parse_faults(self.inject)]}


def validate_worker(ctx, ops, dtypes, sizes, seed, redops, subgroups, faults) -> dict:
    """Runs on every rank (via run_job). Results travel as ctx.emit records; returns a small summary."""
    cases = plan_cases(ops, dtypes, sizes, redops, subgroups, ctx.world_size)
    return run_cases(ctx, cases, seed, faults)


# ---------------------------------------------------------------------------------------------- summary
def summarize_validate(job, opts: ValidateOptions) -> dict:
    """Fold a JobResult of validate_worker into the validate JSON contract."""
    n = job.world_size
    cases = plan_cases(list(opts.ops), list(opts.dtypes), opts.sizes, list(opts.redops), opts.subgroups, n)
    done: dict[int, dict[int, dict]] = {}  # case index -> rank -> record
    entered: dict[int, list[int]] = {}
    for rank, records in job.records.items():
        seq = entered.setdefault(rank, [])
        for rec in records:
            if rec.get("kind") == "enter":
                seq.append(rec["i"])
            elif rec.get("kind") == "case":
                done.setdefault(rec["i"], {})[rank] = rec
    lost = {lr.rank: lr for lr in job.lost}
    culprits: dict[int, list[str]] = {}

    def blame(rank: int, why: str) -> None:
        culprits.setdefault(rank, []).append(why)

    # A rank that skipped a call others entered (its sequence has a gap) desynchronizes everything after it.
    gaps = _sequence_gaps(entered, set(job.results))
    for rank, (idx, peers) in gaps.items():
        blame(rank, f"skipped {cases[idx].label()} which ranks {peers} entered")
    for lr in _primary_lost(list(lost.values()), gaps, entered):
        blame(lr.rank, f"lost ({lr.reason})" + (f" in {lr.in_op}" if lr.in_op else ""))

    rows = []
    first_gap = min((idx for idx, _ in gaps.values()), default=None)
    for c in cases:
        recs = done.get(c.index, {})
        after_gap = first_gap is not None and c.index >= first_gap
        # After a rank skipped a call, the ranks pair up the wrong calls: those failures are consequences.
        row = _row(c, recs, n, lost, (lambda rank, why: None) if after_gap else blame)
        if after_gap and row["status"] == "fail":
            row["reason"] = f"after the skipped call #{first_gap + 1} (calls out of step): {row['reason']}"
        rows.append(row)
    stragglers, per_rank_late = _stragglers(cases, done, n, opts.straggler_s)
    for s in stragglers:
        blame(s["rank"], f"straggler: arrives {s['median_late_s'] * 1e3:.0f} ms late (median over "
                         f"{s['collectives']} collectives)")
    # Nothing verified is not a pass: a run where every call was skipped fails.
    passed = not culprits and all(r["status"] != "fail" for r in rows) and not lost and \
        any(r["status"] == "pass" for r in rows)
    return {
        "passed": passed,
        "world_size": n,
        "backend": job.backend,
        "device": getattr(job, "device", None),
        "iface": getattr(job, "iface", None),
        "results": rows,
        "counts": {status: sum(r["status"] == status for r in rows) for status in ("pass", "fail", "skipped")},
        "culprit_ranks": sorted(culprits),
        "culprits": [{"rank": r, "why": culprits[r]} for r in sorted(culprits)],
        "stragglers": stragglers,
        "per_rank_late_s": per_rank_late,
        "lost": [{"rank": lr.rank, "host": lr.host, "reason": lr.reason, "in_op": lr.in_op} for lr in lost.values()],
        "straggler_threshold_s": opts.straggler_s,
        "injected": list(opts.inject),
    }


def _primary_lost(lost: list, gaps: dict, entered: dict[int, list[int]]) -> list:
    """The lost ranks that explain the failure. A rank that merely stopped (no exit code, no step named) or
    timed out waiting is collateral when another lost rank has a definite cause, or when a rank skipped a
    call (the desynchronization then explains every timeout after it). After a skip, a rank that died in or
    after the skipped call is collateral too: gloo aborts a rank whose peers pair up mismatched calls."""
    first_gap = min((idx for idx, _ in gaps.values()), default=None)

    def after_desync(lr) -> bool:
        calls = entered.get(lr.rank) or []
        return first_gap is not None and bool(calls) and calls[-1] >= first_gap

    definite = [lr for lr in lost if not is_vague(lr.reason) and not after_desync(lr)]
    if definite or gaps:
        return definite
    return lost


def _sequence_gaps(entered: dict[int, list[int]], finished: set[int]) -> dict[int, tuple[int, list[int]]]:
    """rank -> (first case index it skipped, ranks that entered it).

    A rank skipped call i when others entered i and the rank did not, yet it went on: it entered a later
    call, or it finished its whole plan (a skipped last call leaves the others waiting for it).
    """
    out = {}
    for rank, seq in entered.items():
        seen = set(seq)
        last = seq[-1] if seq else -1
        candidates = sorted({i for r, other in entered.items() if r != rank for i in other} - seen)
        for missing in candidates:
            if missing < last or rank in finished:
                out[rank] = (missing, sorted(r for r, other in entered.items() if r != rank and missing in other))
                break
    return out


def _row(c: Case, recs: dict[int, dict], n: int, lost: dict, blame) -> dict:
    spec = get_spec(c.op)
    row = {"op": c.op, "dtype": c.dtype, "count": c.count, "group": c.group, "inplace": c.variant.inplace,
           "max_abs_err": None, "ranks_agree": None, "status": "fail", "reason": "",
           "form": c.variant.form or None, "redop": c.variant.redop, "root": c.variant.root,
           "culprit_ranks": []}
    if c.count is None:
        row["count"] = 0
    missing = sorted(set(range(n)) - set(recs))
    if len(missing) == n:
        row.update(status="skipped", reason="not run: the world stopped before this call (see lost ranks)")
        return row
    if missing:
        row["reason"] = f"no result from ranks {missing}" + (" (lost)" if set(missing) & set(lost) else "")
        row["culprit_ranks"] = sorted(set(missing) & set(lost))
        return row
    errors = [r for r in recs.values() if r["status"] == "error"]
    skipped = [r for r in recs.values() if r["status"] == "skipped"]
    row["count"] = max(r["count"] for r in recs.values())
    if errors:
        row["reason"] = "; ".join(sorted({f"rank {r['rank']}: {r['reason']}" for r in errors}))[:300]
        return row
    if skipped:
        row["status"] = "skipped"
        row["reason"] = skipped[0]["reason"]
        return row
    errs = [r["err"] for r in recs.values() if r["err"] is not None]
    row["max_abs_err"] = max(errs) if errs else 0.0
    row["tolerance"] = max((r["tol"] for r in recs.values()), default=0.0)
    wrong = sorted(r["rank"] for r in recs.values() if r["err"] is not None and not r["ok"])
    agree, odd = _agreement(spec, recs)
    row["ranks_agree"] = agree
    # The reference decides first; a hash minority adds ranks only when the outputs look right but differ.
    culprit = sorted(wrong) if wrong else sorted(odd)
    row["culprit_ranks"] = culprit
    if wrong or agree is False:
        for r in culprit:
            blame(r, f"wrong result in {c.label()}")
        parts = []
        if wrong:
            worst = max(recs.values(), key=lambda r: r["err"] if r["err"] is not None else -1)
            parts.append(f"ranks {wrong} off by up to {worst['err']:.3g} (tolerance {worst['tol']:.3g})")
        if agree is False:
            parts.append(f"outputs differ across ranks (odd: {odd})" if odd else "outputs differ across ranks")
        row["reason"] = "; ".join(parts)
        return row
    row["status"] = "pass"
    return row


def _agreement(spec, recs: dict[int, dict]) -> tuple[bool | None, list[int]]:
    """Replicated ops: every group instance's outputs bit-identical (the minority hash names the odd ranks).
    Others: each output bit-identical to the reference cast to the dtype, when that reference is exact."""
    odd: list[int] = []
    agree = True
    if spec.replicated:
        by_group: dict[tuple, dict[int, str]] = {}
        for r in recs.values():
            if r["hash"] is not None:
                by_group.setdefault(tuple(r["members"]), {})[r["rank"]] = r["hash"]
        for hashes in by_group.values():
            counts: dict[str, int] = {}
            for h in hashes.values():
                counts[h] = counts.get(h, 0) + 1
            if len(counts) > 1:
                agree = False
                majority = max(counts, key=lambda h: (counts[h], h))
                if counts[majority] * 2 > len(hashes):  # a strict majority names the odd ranks
                    odd += [rk for rk, h in hashes.items() if h != majority]
        return agree, sorted(odd)
    exact = [r for r in recs.values() if r["hash"] is not None and r["ref_hash"] is not None]
    if not exact:
        return None, []
    odd = sorted(r["rank"] for r in exact if r["hash"] != r["ref_hash"])
    return (not odd), odd


def _stragglers(cases, done, n: int, threshold: float) -> tuple[list[dict], dict[str, float]]:
    """The ranks late at the pre-call barrier by the one straggler rule (world/lateness.py) with a floor of
    `threshold` seconds, and every rank's median lateness (rank -> seconds).

    Everyone leaves a barrier together, so a rank's wait there is the barrier's end minus its arrival: -wait is
    its arrival on a clock shared within that call (no clock sync across hosts needed)."""
    arrivals = []
    for idx, recs in done.items():
        by_group: dict[tuple, dict[int, float]] = {}
        for r in recs.values():
            if r.get("wait") is not None:
                by_group.setdefault(tuple(r["members"]), {})[r["rank"]] = -r["wait"]
        arrivals += by_group.values()
    found = late_ranks(arrivals, min_late_s=threshold)
    out = []
    for rank, med in sorted(found.late.items()):
        values = found.samples_s[rank]
        out.append({"rank": rank, "median_late_s": round(med, 4),
                    "share_late": round(sum(v >= threshold for v in values) / len(values), 3),
                    "collectives": len(values)})
    return out, {str(rank): round(med, 5) for rank, med in sorted(found.median_s.items())}


# ---------------------------------------------------------------------------------------------- run
MAX_CHECKS = 100_000  # the default plan is ~2 300 checks on 4 ranks (a few minutes); 100 000 is hours


def check_memory(opts: ValidateOptions, n: int) -> None:
    """Refuse, as bench does, sizes whose buffers cannot fit in this host's memory, before any rank starts: the
    largest call's input, output and float64 reference (bench.sweep.rank_bytes) x the ranks on this host."""
    from distdoctor.bench.sweep import available_memory, rank_bytes
    from distdoctor.collectives.base import itemsize
    from distdoctor.world.launchers import detect

    avail = available_memory()
    if avail is None:
        return
    launch = detect()
    local = (launch.local_world_size or launch.world_size) if launch else n
    sizes = parse_sizes(opts.sizes)
    largest = {dt: max(sizes, key=lambda s, dt=dt: s.count(dt)) for dt in opts.dtypes}  # the peak is the largest
    need, size, op, dtype = max(
        (rank_bytes(op, get_spec(op).size_bytes(largest[dt].count(dt), itemsize(dt), n), dt, n, True), largest[dt],
         op, dt) for op in opts.ops if get_spec(op).has_data for dt in opts.dtypes)
    if need * local > avail:
        raise InputError("--sizes", f"{size} of {op} {dtype} needs about {need / 2**30:.1f} GiB per rank x {local} "
                                    f"ranks on this host = {need * local / 2**30:.1f} GiB, but {avail / 2**30:.1f} "
                                    f"GiB is available (MemAvailable): give smaller --sizes")


def run_validate(cfg: WorldConfig, opts: ValidateOptions, on_event=None) -> dict | None:
    """Run validate on the world `cfg` describes. Returns the report on the reporting rank, None elsewhere."""
    opts.check()
    world_size = resolve_nproc(cfg)
    if world_size is not None:
        if world_size < min_world(cfg.backend):
            raise InputError("--nproc", "validate needs a world of at least 2 ranks (one GPU with --backend nccl)")
        parse_faults(opts.inject, world_size=world_size)  # an injected rank outside the world: one line
        sizes = parse_sizes(opts.sizes)
        one = plan_cases(list(opts.ops), list(opts.dtypes), sizes[:1], list(opts.redops), opts.subgroups, world_size)
        planned = sum(len(sizes) if c.size is not None else 1 for c in one)  # without building every case
        if planned > MAX_CHECKS:
            raise InputError("--sizes", f"{planned} checks planned on {world_size} ranks (--ops x --dtypes x --redops x "
                                        f"--sizes x groups), above the {MAX_CHECKS} one run makes: give fewer")
        check_memory(opts, world_size)
    job = run_job("distdoctor.validate.sweep:validate_worker", opts.worker_args(), cfg, on_event=on_event)
    if not job.is_reporter:
        return None
    return summarize_validate(job, opts)
