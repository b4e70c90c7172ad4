"""Run every analysis over a TraceSet and rank the findings root cause first, without cascades.

Order of reasoning:
1. wait-for graph (waitfor.py): cycles are deadlocks (order_deadlock, p2p_deadlock); they explain every
   missing rank and stuck state on their groups.
2. ranks of the world without a trace: missing_dump; the survivors' waits on them are consequences.
3. per-group first divergence (match.py): mismatches are findings. An absent rank that is itself blocked in
   another collective is a consequence (its own wait is reported where it waits); only absent ranks that are
   in no collective (stuck in Python: a data loader, a sleep, an exit path) become missing_ranks, described by
   what they did last and their current stack when the trace has one. State divergences on groups with lost
   members are consequences of the loss.
4. stragglers, only when nothing hangs.
Findings sort by kind priority (findings.PRIORITY), then by when their evidence happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from distdoctor.diagnose import p2p
from distdoctor.diagnose.findings import PRIORITY, Finding, fmt_group, fmt_ranks
from distdoctor.diagnose.match import Divergence, GroupView, build_views, divergences
from distdoctor.diagnose.progress import describe_rank, rank_progress, where_now
from distdoctor.diagnose.straggler import find_stragglers
from distdoctor.diagnose.waitfor import Cycle, Wait, build_waits, describe_cycle, find_cycles, graph
from distdoctor.trace.model import Entry, TraceSet

MISMATCHES = ("type_mismatch", "size_mismatch", "dtype_mismatch", "root_mismatch")


@dataclass
class Report:
    traces: TraceSet
    findings: list[Finding]
    ranks: dict[str, dict]
    world_size: int | None
    waits: list[Wait] = field(default_factory=list)
    cycles: list[Cycle] = field(default_factory=list)
    consequences: list[dict] = field(default_factory=list)
    views: dict[str, GroupView] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return "problem" if self.findings else "ok"

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict,
            "world_size": self.world_size,
            "findings": [f.to_json() for f in self.findings],
            "ranks": self.ranks,
            "load_errors": [{"path": e.path, "reason": e.reason} for e in self.traces.errors],
            "consequences": self.consequences,
            "wait_for": [{"rank": w.rank, "group": w.entry.group, "seq": w.entry.seq, "op": w.entry.op,
                          "waits_for": w.waits_for} for w in self.waits],
            "groups": {name: {"members": v.members, "inferred": v.inferred} for name, v in sorted(self.views.items())},
        }


def analyze(ts: TraceSet) -> Report:
    views = build_views(ts)
    waits, pending = build_waits(ts, views)
    g = graph(waits)
    cycles = find_cycles(g)
    findings: list[Finding] = []
    consequences: list[dict] = []

    for c in cycles:
        if not c.p2p_only:
            findings.append(_order_deadlock(c))
    findings.extend(p2p.cycle_findings(cycles))
    findings.extend(p2p.pair_disagreements(ts))
    on_cycle = {r for c in cycles for r in c.ranks}

    world = range(ts.world_size or 0)
    no_dump = [r for r in world if r not in ts.ranks]
    if no_dump:
        findings.append(_missing_dump(no_dump, waits))

    for d in divergences(ts, views):
        if d.kind in MISMATCHES:
            findings.append(_from_divergence(d))
        elif d.kind == "missing_ranks":
            idle = [r for r in d.ranks if not pending.get(r) and r not in on_cycle]
            explained = [r for r in d.ranks if r not in idle]
            if idle:
                f = _missing_ranks(d, idle, ts, pending)
                if explained:
                    f.detail += f" ({fmt_ranks(explained)} also never issued it, but are blocked elsewhere.)"
                findings.append(f)
            else:
                consequences.append({"kind": d.kind, "group": d.group, "seq": d.seq, "op": d.op, "ranks": d.ranks,
                                     "because": "those ranks are blocked in other collectives"})
        elif d.kind == "state_mismatch":
            members = views[d.group].members
            lost = [r for r in members if r not in ts.ranks]
            if lost or set(d.ranks) & on_cycle:
                consequences.append({"kind": d.kind, "group": d.group, "seq": d.seq, "op": d.op, "ranks": d.ranks,
                                     "because": "members were lost" if lost else "a deadlock cycle holds them"})
            else:
                findings.append(_from_divergence(d))
    if not findings:
        findings.extend(find_stragglers(views))

    findings.sort(key=lambda f: (PRIORITY[f.kind], f.t if f.t is not None else float("inf"), f.ranks))
    ranks = {str(r): rank_progress(t, pending.get(r, [])) for r, t in ts.ranks.items()}
    for r in no_dump:
        ranks[str(r)] = {"missing": True}
    return Report(ts, findings, dict(sorted(ranks.items(), key=lambda kv: int(kv[0]))), ts.world_size, waits,
                  cycles, consequences, views)


def _order_deadlock(c: Cycle) -> Finding:
    first = c.path[0][2].entry
    return Finding("order_deadlock", c.ranks, group=first.group, groups=c.groups, seq=first.seq, op=first.op,
                   t=first.t_created,
                   detail=f"{fmt_ranks(c.ranks)} wait for each other across groups {', '.join(repr(x) for x in c.groups)}: "
                          f"their collectives were issued in different orders. Cycle: {describe_cycle(c)}.",
                   evidence={"cycle": [{"rank": a, "waits_for": b, "group": w.entry.group, "seq": w.entry.seq,
                                        "op": w.entry.op} for a, b, w in c.path]})


def _missing_dump(no_dump: list[int], waits: list[Wait]) -> Finding:
    blocked = [w for w in waits if set(w.waits_for) & set(no_dump)]
    detail = f"{fmt_ranks(no_dump)} left no trace (crashed, killed, or never dumped)."
    group = seq = op = t = None
    if blocked:
        w = min(blocked, key=lambda w: w.rank)
        e = w.entry
        group, seq, op, t = e.group, e.seq, e.op, e.t_created
        detail += (f" {fmt_ranks(sorted({w.rank for w in blocked}))} wait for them, "
                   f"rank {w.rank} in {op} #{seq} on {fmt_group(group)}.")
    return Finding("missing_dump", no_dump, group=group, seq=seq, op=op, t=t, detail=detail,
                   evidence={"blocked": sorted({w.rank for w in blocked})})


def _missing_ranks(d: Divergence, idle: list[int], ts: TraceSet, pending: dict[int, list[Entry]]) -> Finding:
    detail = (f"{fmt_ranks(d.present)} issued {d.op} #{d.seq} on {fmt_group(d.group)}; "
              f"{fmt_ranks(idle)} never did. " + "; ".join(describe_rank(r, ts.ranks.get(r), pending.get(r, []))
                                                         for r in idle) + ".")
    evidence = {"issued_by": d.present, "last": {}, "now": {}}
    for r in idle:
        t = ts.ranks.get(r)
        done = [e for e in t.entries if e.state == "completed"] if t else []
        if done:
            e = done[-1]
            evidence["last"][str(r)] = {"group": e.group, "seq": e.seq, "op": e.op}
        now = where_now(t) if t else None
        if now:
            evidence["now"][str(r)] = now
    return Finding("missing_ranks", idle, group=d.group, seq=d.seq, op=d.op, t=d.t, detail=detail, evidence=evidence)


def _from_divergence(d: Divergence) -> Finding:
    if d.kind == "state_mismatch":
        detail = (f"{d.op} #{d.seq} on {fmt_group(d.group)} completed on {fmt_ranks(d.evidence['completed'])} "
                  f"but {fmt_ranks(d.ranks)} {'is' if len(d.ranks) == 1 else 'are'} still in it.")
    else:
        what = d.kind.split("_")[0]
        verb = {"type": "issued a different collective", "size": "passed different sizes",
                "dtype": "passed a different dtype", "root": "named a different root"}[what]
        detail = f"at {d.op} #{d.seq} on {fmt_group(d.group)} {fmt_ranks(d.ranks)} {verb} than the other members: {d.detail}."
    return Finding(d.kind, d.ranks, group=d.group, seq=d.seq, op=d.op, t=d.t, detail=detail, evidence=d.evidence)


def wait_graph(report: Report) -> nx.DiGraph:
    return graph(report.waits)
