"""Flight Recorder dump sets of an NCCL job, simulated with NCCL's semantics, with planted faults.

A Megatron-like mesh (TP x PP x DP, EP splitting DP) runs steps: per micro-batch a TP all_gather, two EP
all_to_alls, a TP reduce_scatter and the pipeline's send/recv on its PP group; per step a DP all_reduce, then a
sync point. Each rank's CPU enqueues in that order and runs ahead to the sync point (where it waits for its GPU);
the GPU runs one stream per group in order; a collective completes when every member's stream has it at its head
with the same arguments, a send/recv when both halves are at their streams' heads. The dump is what PyTorch's
watchdog writes (version 2.9/2.10 keys, `pg_status` per local pg_id, timing off: entries stay `scheduled`),
active-only or a ring of the last entries, as pickles or JSON, under any file prefix.

Faults (each names its faulty ranks): gpu_stall (the rank's GPU stops completing work as the real dumps show it:
its peers complete what it enqueued, its completion frontier freezes, its CPU blocks at the next sync point),
cpu_stall (its CPU stops enqueueing; its dump is empty, or missing), extra / skip (one collective more or fewer
on one rank), size (mismatched sizes), p2p_order (two pipeline neighbours both send first). `healthy`: caught
mid-flight, every CPU at its sync point, no fault.
"""

from __future__ import annotations

import itertools
import json
import pickle
import random
from dataclasses import dataclass, field
from pathlib import Path

_CLOCK = itertools.count()
FAULTS = ("gpu_stall", "cpu_stall", "extra", "skip", "size", "p2p_order", "healthy")
DESC = {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
        "dp": "DATA_PARALLEL_GROUP", "ep": "EXPERT_MODEL_PARALLEL_GROUP"}


@dataclass
class Op:
    group: str
    kind: str  # all_gather, all_to_all, reduce_scatter, all_reduce, send, recv, sync
    size: int = 4096
    peer: int | None = None  # global rank, p2p
    seq: int = 0  # per group: collective seq, or the rank's p2p seq on the group
    state: int = 0  # 0 queued, 1 completed
    done_at: int = -1  # how many ops the rank had completed before this one
    created: int = 0  # enqueue order across the world (time_created_ns)


@dataclass
class Rank:
    ops: list[Op] = field(default_factory=list)  # program in CPU order
    cpu: int = 0  # next op to enqueue
    heads: dict[str, int] = field(default_factory=dict)  # group -> index into `queued[group]`
    queued: dict[str, list[Op]] = field(default_factory=dict)
    cpu_stopped: bool = False
    reports_from: int | None = None  # gpu_stall: completions after this op count are never reported
    done_ops: int = 0
    stop_at: int | None = None  # cpu_stall: the CPU stops before enqueueing this op of its program
    freeze_at: int | None = None  # gpu_stall: the GPU stops reporting once it completed this many ops


def mesh(tp: int, pp: int, dp: int, ep: int) -> tuple[int, dict[str, list[int]], dict[str, str]]:
    """world size, group name -> members, group name -> kind; names numbered in creation order, as torch does."""
    world = tp * pp * dp
    groups: dict[str, list[int]] = {"0": list(range(world))}
    kinds = {"0": "world"}
    def rank(t: int, p: int, d: int) -> int:  # tp fastest, then dp, then pp: Megatron's order
        return t + tp * (d + dp * p)

    sets = {"tp": [[rank(t, p, d) for t in range(tp)] for p in range(pp) for d in range(dp)],
            "dp": [[rank(t, p, d) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[rank(t, p, d) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "ep": [[rank(t, p, d) for d in range(b, b + ep)] for p in range(pp) for t in range(tp)
                   for b in range(0, dp, ep)]}
    for kind in ("tp", "dp", "pp", "ep"):
        for members in sets[kind]:
            name = str(len(groups))
            groups[name], kinds[name] = members, kind
    return world, groups, kinds


def _program(r: int, groups: dict[str, list[int]], kinds: dict[str, str], steps: int, micro: int) -> list[Op]:
    # Megatron makes no call on a group of one (TP=1, EP=1): its mappings return the tensor as it is.
    mine = {kinds[g]: g for g, m in groups.items() if r in m and kinds[g] != "world" and len(m) > 1}
    pp = groups[mine["pp"]]
    stage = pp.index(r)
    prev, nxt = (pp[stage - 1] if stage else None), (pp[stage + 1] if stage + 1 < len(pp) else None)
    ops: list[Op] = []
    for _ in range(steps):
        for _m in range(micro):
            if prev is not None:
                ops.append(Op(mine["pp"], "recv", peer=prev))
            ops += [Op(mine[k], kind, size) for k, kind, size in (("tp", "all_gather", 4096), ("ep", "all_to_all", 4096),
                    ("ep", "all_to_all", 2048), ("tp", "reduce_scatter", 4096)) if k in mine]
            if nxt is not None:
                ops.append(Op(mine["pp"], "send", peer=nxt))
        ops += [Op(mine["dp"], "all_reduce", 1 << 20), Op("", "sync")]  # DP >= 2 in every plan
    return ops


@dataclass
class Plan:
    tp: int = 2
    pp: int = 2
    dp: int = 2
    ep: int = 2
    steps: int = 3
    micro: int = 2
    fault: str = "healthy"
    faulty: list[int] = field(default_factory=list)
    at: float = 0.5  # when the fault strikes, as a fraction of the run
    active_only: bool = True
    missing_dump: bool = False  # cpu_stall: the stuck rank writes no dump at all


def random_plan(rng: random.Random, max_world: int = 64) -> Plan:
    while True:
        tp, pp, dp = rng.choice([1, 2, 4]), rng.choice([2, 4]), rng.choice([2, 4, 8])
        if 8 <= tp * pp * dp <= max_world:
            break
    fault = rng.choice(FAULTS)
    plan = Plan(tp, pp, dp, rng.choice([e for e in (1, 2, 4) if dp % e == 0]), rng.randint(2, 4), rng.randint(1, 3),
                fault, at=rng.uniform(0.2, 0.8), active_only=rng.random() < 0.7, missing_dump=rng.random() < 0.5)
    world = tp * pp * dp
    if fault == "p2p_order":
        plan.faulty = _neighbours(plan, rng)
    elif fault != "healthy":
        plan.faulty = sorted(rng.sample(range(world), 2 if fault in ("gpu_stall", "cpu_stall") and rng.random() < 0.5
                                        else 1))
    return plan


def plan_from(options: dict, faulty: str, seed: int) -> Plan:
    """The plan `distdoctor sim nccl` asks for; InputError (one line) for what cannot be."""
    from distdoctor.errors import InputError

    tp, pp, dp, ep = (options[k] for k in ("tp", "pp", "dp", "ep"))
    if dp % ep:
        raise InputError("--ep", f"{ep} does not divide --dp {dp}")
    world = tp * pp * dp
    if world > 16384:
        raise InputError("--tp x --pp x --dp", f"{world} ranks (16384 at most)")
    plan = Plan(tp, pp, dp, ep, options["steps"], options["micro"], options["fault"], at=options["at"],
                active_only=not options["full"], missing_dump=options["missing_dump"])
    if plan.fault == "healthy":
        return plan
    try:
        plan.faulty = sorted({int(x) for x in faulty.split(",") if x.strip()})
    except ValueError:
        raise InputError("--faulty", f"{faulty!r} is not a comma-separated list of ranks") from None
    if not plan.faulty:
        drawn = random_plan(random.Random(seed), world)
        plan.faulty = _neighbours(plan, random.Random(seed)) if plan.fault == "p2p_order" else \
            sorted(random.Random(seed).sample(range(world), min(len(drawn.faulty) or 1, world)))
    bad = [r for r in plan.faulty if not 0 <= r < world]
    if bad:
        raise InputError("--faulty", f"rank {bad[0]} is not in a world of {world}")
    if plan.fault == "p2p_order" and (len(plan.faulty) != 2 or not _pp_neighbours(plan, *plan.faulty)):
        raise InputError("--faulty", "p2p_order needs two ranks that are neighbouring pipeline stages")
    return plan


def _neighbours(plan: Plan, rng: random.Random) -> list[int]:
    d, t, p = rng.randrange(plan.dp), rng.randrange(plan.tp), rng.randrange(plan.pp - 1)
    return [t + plan.tp * (d + plan.dp * p), t + plan.tp * (d + plan.dp * (p + 1))]


def _pp_neighbours(plan: Plan, a: int, b: int) -> bool:
    return abs(a - b) == plan.tp * plan.dp


def _plant(plan: Plan, progs: dict[int, list[Op]], groups: dict[str, list[int]]) -> None:
    """Change the faulty ranks' programs (argument faults) at the fault's place."""
    for r in plan.faulty:
        ops = progs[r]
        # sizes must agree except all_to_all's (uneven splits are legal), so a size fault avoids it
        colls = [i for i, o in enumerate(ops) if o.kind not in ("send", "recv", "sync")
                 and not (plan.fault == "size" and o.kind == "all_to_all")]
        i = colls[int(plan.at * (len(colls) - 1))]
        if plan.fault == "extra":
            ops.insert(i, Op(ops[i].group, "all_reduce", 8))
        elif plan.fault == "skip":
            del ops[i]
        elif plan.fault == "size":
            ops[i].size += 1
    if plan.fault == "p2p_order":
        a, b = plan.faulty
        pp = next(g for g, m in groups.items() if a in m and b in m and len(m) == plan.pp)
        for x, y in ((a, b), (b, a)):
            ops = progs[x]
            at = [i for i, o in enumerate(ops) if o.kind == "sync"][int(plan.at * (plan.steps - 1))]
            ops[at:at] = [Op(pp, "send", 64, y), Op(pp, "recv", 64, y)]


def run(plan: Plan, seed: int = 0) -> tuple[dict[int, Rank], dict[str, list[int]], dict[str, str]]:
    rng = random.Random(seed)
    world, groups, kinds = mesh(plan.tp, plan.pp, plan.dp, plan.ep)
    progs = {r: _program(r, groups, kinds, plan.steps, plan.micro) for r in range(world)}
    _plant(plan, progs, groups)
    ranks = {r: Rank(ops) for r, ops in progs.items()}
    for r in plan.faulty if plan.fault in ("gpu_stall", "cpu_stall") else ():
        # At `at` of the rank's own program, and never after its last call: a stop then would change nothing.
        calls = [i for i, o in enumerate(ranks[r].ops) if o.kind != "sync"]
        k = min(int(plan.at * len(calls)), len(calls) - 1)
        if plan.fault == "cpu_stall":
            ranks[r].stop_at = calls[k]
        else:
            ranks[r].freeze_at = k
    stop_at = int(plan.at * sum(len(o) for o in progs.values()) * 0.5)
    for _round in range(100000):
        for r, st in ranks.items():
            _cpu_phase(r, st)
        if plan.fault == "healthy" and sum(st.done_ops for st in ranks.values()) >= stop_at and rng.random() < 0.5:
            break  # caught mid-flight: every CPU at its sync point
        if not _gpu_phase(ranks, groups, rng) and all(_cpu_blocked(st) for st in ranks.values()):
            break  # nothing moves: the watchdog's timeout dumps what is there
    return ranks, groups, kinds


def _cpu_blocked(st: Rank) -> bool:
    return st.cpu_stopped or st.cpu >= len(st.ops) or st.ops[st.cpu].kind == "sync"


def _cpu_phase(r: int, st: Rank) -> None:
    """Enqueue up to the next sync point (passing it once everything enqueued is complete)."""
    while not st.cpu_stopped and st.cpu < len(st.ops):
        if st.stop_at is not None and st.cpu >= st.stop_at:
            st.cpu_stopped = True
            return
        op = st.ops[st.cpu]
        if op.kind == "sync":
            busy = any(o.state == 0 for q in st.queued.values() for o in q)
            if busy or (st.reports_from is not None):
                return  # the GPU has not finished (or a stalled GPU never says it has)
            st.cpu += 1
            continue
        q = st.queued.setdefault(op.group, [])
        op.seq = 1 + sum(1 for o in q if (o.kind in ("send", "recv")) == (op.kind in ("send", "recv")))
        q.append(op)
        st.cpu += 1
        op.created = _CLOCK.__next__()


def _head(st: Rank, g: str) -> Op | None:
    q = st.queued.get(g, [])
    i = st.heads.get(g, 0)
    return q[i] if i < len(q) else None


def _gpu_phase(ranks: dict[int, Rank], groups: dict[str, list[int]], rng: random.Random) -> bool:
    """Complete what can complete (a random part of it: streams run at their own pace); whether anything could."""
    ready = []
    for g, members in groups.items():
        heads = {r: _head(ranks[r], g) for r in members}
        for r, op in heads.items():
            if op is None:
                continue
            if op.kind in ("send", "recv"):
                other = heads.get(op.peer)
                want = "recv" if op.kind == "send" else "send"
                if other is not None and other.kind == want and other.peer == r and other.size == op.size and r < op.peer:
                    ready.append([(r, g), (op.peer, g)])
            elif r == members[0] and all(h is not None and h.kind == op.kind and
                                         (h.size == op.size or op.kind == "all_to_all") for h in heads.values()):
                ready.append([(m, g) for m in members])
    for pairs in ready:
        if rng.random() < 0.6:
            for r, g in pairs:
                st = ranks[r]
                op = _head(st, g)
                op.state, op.done_at = 1, st.done_ops
                if st.freeze_at is not None and st.reports_from is None and st.done_ops >= st.freeze_at:
                    st.reports_from = st.done_ops  # this completion and all later ones are never reported
                st.heads[g] = st.heads.get(g, 0) + 1
                st.done_ops += 1
    return bool(ready)


# ---- the dumps -------------------------------------------------------------------------------------------------

def _reported(st: Rank, op: Op) -> bool:
    return op.state == 1 and (st.reports_from is None or op.done_at < st.reports_from)


def _sizes(op: Op, n: int) -> tuple[list, list]:
    shape = [op.size, 1024]
    if op.kind == "all_gather":
        return [shape], [[op.size * n, 1024]]
    if op.kind == "reduce_scatter":
        return [[op.size * n, 1024]], [shape]
    return [shape], [shape]


def dump_of(r: int, st: Rank, groups: dict[str, list[int]], kinds: dict[str, str], plan: Plan,
            version: str = "2.9", ring: int = 2000) -> dict:
    """Rank r's Flight Recorder dump, as PyTorch's watchdog writes it (pickle form; see to_json)."""
    mine = [g for g in groups if r in groups[g]]  # creation order: the rank's local pg_ids
    pg_id = {g: i for i, g in enumerate(mine)}
    config = {g: {"name": g, "desc": DESC.get(kinds[g], "default_pg"), "ranks": str(groups[g])} for g in mine}
    status, entries = {}, []
    enqueued = [o for g in mine for o in st.queued.get(g, [])]
    for g in mine:
        q = st.queued.get(g, [])
        done = [o.seq for o in q if _reported(st, o)]
        status[str(pg_id[g])] = {"last_enqueued_collective": q[-1].seq if q else -1, "last_started_collective": -1,
                                 "last_completed_collective": max(done) if done else -1}
    keep = [o for o in sorted(enqueued, key=lambda o: o.created) if not (plan.active_only and _reported(st, o))]
    for o in keep[-ring:]:
        members = groups[o.group]
        p2p = o.kind in ("send", "recv")
        name = f"nccl:{o.kind}"
        if p2p:
            me, peer = members.index(r), members.index(o.peer)
            name += f" {me}->{peer}" if o.kind == "send" else f" {me}<-{peer}"
        ins, outs = _sizes(o, len(members))
        done = _reported(st, o)
        entries.append({"record_id": o.created, "pg_id": pg_id[o.group], "process_group": (o.group, config[o.group]["desc"]),
                        "thread_name": "pt_autograd_0", "thread_id": "1", "collective_seq_id": 0 if p2p else o.seq,
                        "p2p_seq_id": o.seq if p2p else 0, "op_id": o.seq, "profiling_name": name,
                        "time_created_ns": 1_700_000_000_000_000_000 + o.created * 1000, "input_sizes": ins,
                        "input_dtypes": ["BFloat16"], "output_sizes": outs, "output_dtypes": ["BFloat16"],
                        "state": "completed" if done else "scheduled", "time_discovered_started_ns": None,
                        "time_discovered_completed_ns": None, "retired": done, "timeout_ms": 600000, "is_p2p": p2p})
    return {"version": version, "pg_config": config, "nccl_version": "2.27.3", "pg_status": status, "entries": entries}


def to_json(dump: dict) -> dict:
    """What _dump_fr_trace_json writes of the same dump: pg_status values as strings, unknown times 0."""
    out = dict(dump)
    out["pg_status"] = {k: {f: str(v) for f, v in st.items()} for k, st in dump["pg_status"].items()}
    out["entries"] = [{**e, "process_group": list(e["process_group"]), "time_discovered_started_ns": 0,
                       "time_discovered_completed_ns": 0} for e in dump["entries"]]
    return out


@dataclass
class Truth:
    """What was planted: the faulty ranks, and those among them whose fault the dumps cannot show (`hidden`: a
    GPU whose unreported completions no dump proves - on groups whose other members stopped too, or send/recv in
    active-only dumps, which drop the completed halves; a CPU that stopped while its GPU was held by another
    stopped rank)."""
    faulty: list[int]
    hidden: list[int] = field(default_factory=list)


def write_set(out: str | Path, plan: Plan, seed: int = 0, form: str = "pickle", prefix: str = "_dump_") -> Truth:
    """Simulate `plan` and write one dump per rank under `out` (`prefix`<rank>)."""
    ranks, groups, kinds = run(plan, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for r, st in ranks.items():
        if plan.fault == "cpu_stall" and plan.missing_dump and r in plan.faulty:
            continue  # so stuck it wrote nothing
        dump = dump_of(r, st, groups, kinds, plan, "2.10" if seed % 2 else "2.9")
        path = out / f"{prefix}{r}"
        if form == "json":
            path.write_text(json.dumps(to_json(dump)))
        else:
            path.write_bytes(pickle.dumps(dump))
    hidden = [r for r in plan.faulty if (plan.fault == "gpu_stall" and _unseen(r, ranks[r], groups, plan))
              or (plan.fault == "cpu_stall" and not plan.missing_dump and _masked(ranks[r]))]
    return Truth(list(plan.faulty), hidden)


def _masked(st: Rank) -> bool:
    """A stopped CPU whose GPU still waits in calls it enqueued (for another stopped rank): an innocent rank
    blocked there looks the same - how far its CPU got before its sync point is not in any dump."""
    return any(o.state == 0 for q in st.queued.values() for o in q)


def _unseen(r: int, st: Rank, groups: dict[str, list[int]], plan: Plan) -> bool:
    """A stopped GPU whose unreported completions no dump proves: each was on a group whose other members
    stopped too, or a send/recv whose completed half an active-only dump drops."""
    unreported = [o for q in st.queued.values() for o in q if o.state == 1 and o.done_at >= st.reports_from]

    def proven(o: Op) -> bool:
        if o.kind in ("send", "recv"):
            return not plan.active_only and o.peer not in plan.faulty
        return any(m not in plan.faulty for m in groups[o.group] if m != r)

    return bool(unreported) and not any(map(proven, unreported))


def judge(findings: list, truth: Truth) -> str:
    """Why diagnose's findings on a generated set are wrong ("" when right): a healthy set has none; otherwise the
    first finding names only faulty ranks (or, when it says the evidence cannot tell which of its ranks is wrong,
    names a faulty one among them), and every faulty rank the dumps can show is named by some finding."""
    faulty = truth.faulty
    if not faulty:
        return f"healthy set, yet {findings[0].kind} on ranks {findings[0].ranks}" if findings else ""
    if not findings:
        return "" if set(faulty) <= set(truth.hidden) else "no finding"
    first = set(findings[0].ranks)
    if findings[0].evidence.get("undecided"):
        if not first & set(faulty):
            return f"first finding ({findings[0].kind}, one of {sorted(first)}) names no faulty rank"
    elif not first <= set(faulty):
        return f"first finding ({findings[0].kind}) names innocent ranks {sorted(first - set(faulty))}"
    missed = set(faulty) - set(truth.hidden) - {r for f in findings for r in f.ranks}
    return f"faulty ranks {sorted(missed)} not named" if missed else ""
