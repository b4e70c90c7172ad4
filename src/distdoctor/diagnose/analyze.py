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
5. per-rank logs (threads.py): threads inside an op they never finished, as stuck_thread findings after the others.
Findings sort by kind priority (findings.PRIORITY), then by when their evidence happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distdoctor.diagnose import p2p
from distdoctor.diagnose.findings import PRIORITY, Finding, fmt_group, fmt_ranks
from distdoctor.diagnose.match import Divergence, GroupView, build_views, callsite_divergence, divergences
from distdoctor.diagnose.progress import describe_rank, is_gloo_fr, last_completed, rank_progress, where_now
from distdoctor.diagnose.straggler import find_stragglers
from distdoctor.diagnose.threads import thread_findings
from distdoctor.diagnose.waitfor import (Cycle, Wait, build_waits, describe_cycle, find_cycles, graph,
                                         on_possible_cycle)
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
    cyclic = on_possible_cycle(waits)
    cycles = find_cycles(graph(cyclic) if cyclic else None)
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
        findings.append(_missing_dump(no_dump, waits, views))

    for d in divergences(ts, views):
        if d.kind in MISMATCHES:
            findings.append(_from_divergence(d))
        elif d.kind == "missing_ranks":
            idle = [r for r in d.ranks if not pending.get(r) and r not in on_cycle]
            explained = [r for r in d.ranks if r not in idle]
            if idle:
                f = _missing_ranks(d, idle, ts, pending)
                for r in idle:
                    site = callsite_divergence(views[d.group], r, d.seq)
                    if site:
                        f.detail += (f" Rank {r}'s call sites part from the others' at {site['op']} #{site['seq']}: "
                                     f"it called from {site['rank_site']} where {fmt_ranks(site['others'])} called "
                                     f"from {site['others_site']}.")
                        f.evidence.setdefault("callsite_divergence", {})[str(r)] = site
                if any(is_gloo_fr(ts.ranks.get(r)) for r in idle):
                    f.detail += (" (Gloo's Flight Recorder does not record send/recv: a rank blocked in p2p looks idle "
                                 "in these dumps; the distdoctor recorder's traces show it.)")
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
    findings.extend(p2p.unposted_peers(ts, waits, pending, on_cycle))
    if not findings:
        findings.extend(find_stragglers(views))

    findings.sort(key=lambda f: (PRIORITY[f.kind], f.t if f.t is not None else float("inf"), f.ranks))
    findings = _one_finding_per_absent_rank(findings, consequences)
    stuck, thread_ranks = thread_findings(ts, others_found=bool(findings))  # per-rank logs: threads inside an op
    findings += stuck  # after the collective findings, in their own order (strongest first)
    progress = {r: rank_progress(t, pending.get(r, [])) for r, t in ts.ranks.items()}
    missing = {"missing": True}  # one object for every absent rank: a corrupt rank number can imply a huge world
    ranks = {str(r): progress.get(r, missing) for r in sorted(set(progress).union(no_dump))}
    for r, extra in thread_ranks.items():  # per-rank logs: "threads" and "log"
        ranks[str(r)].update(extra)
    return Report(ts, findings, ranks, ts.world_size, waits, cycles, consequences, views)


def _one_finding_per_absent_rank(findings: list[Finding], consequences: list[dict]) -> list[Finding]:
    """A rank that stopped is absent from the next collective of every group it belongs to: the first of those
    (by time) is the finding, the others are consequences, named in its detail."""
    kept: list[Finding] = []
    seen: dict[int, Finding] = {}
    for f in findings:
        if f.kind != "missing_ranks":
            kept.append(f)
            continue
        new = [r for r in f.ranks if r not in seen]
        if len(new) == len(f.ranks):
            kept.append(f)
            for r in f.ranks:
                seen[r] = f
            continue
        consequences.append({"kind": f.kind, "group": f.group, "seq": f.seq, "op": f.op, "ranks": f.ranks,
                             "because": "the same ranks are already missing from an earlier collective"})
        for r in f.ranks:
            if r in seen:
                also = seen[r].evidence.setdefault("also_absent_from", [])
                if (f.group, f.seq) not in [(a["group"], a["seq"]) for a in also]:
                    also.append({"group": f.group, "seq": f.seq, "op": f.op})
        if new:  # some ranks are new: they still deserve their own finding
            f.ranks = new
            kept.append(f)
            for r in new:
                seen[r] = f
    for f in kept:
        also = f.evidence.get("also_absent_from")
        if also:
            f.detail += (" The same rank(s) never reached " + ", ".join(
                f"{a['op']} #{a['seq']} on group '{a['group']}'" for a in also[:5])
                + (f" and {len(also) - 5} more" if len(also) > 5 else "") + " either (consequences).")
    return kept


def _order_deadlock(c: Cycle) -> Finding:
    first = c.path[0][2].entry
    return Finding("order_deadlock", c.ranks, group=first.group, groups=c.groups, seq=first.seq, op=first.op,
                   t=first.t_created,
                   detail=f"{fmt_ranks(c.ranks)} wait for each other across groups {', '.join(repr(x) for x in c.groups)}: "
                          f"their collectives were issued in different orders. Cycle: {describe_cycle(c)}.",
                   evidence={"cycle": [{"rank": a, "waits_for": b, "group": w.entry.group, "seq": w.entry.seq,
                                        "op": w.entry.op} for a, b, w in c.path]})


def _missing_dump(no_dump: list[int], waits: list[Wait], views: dict[str, GroupView]) -> Finding:
    """Where the survivors stand: the collective they wait in for the lost ranks, else the last collective the
    survivors issued on the default group (the lost ranks cannot have completed it)."""
    blocked = sorted({w.rank for w in waits if set(w.waits_for) & set(no_dump)})
    detail = f"{fmt_ranks(no_dump)} left no trace (crashed, killed, or never dumped)."
    group = seq = op = t = None
    view = views.get("0")
    if view is not None:
        last = [(max(seqs), r) for r, seqs in view.by_rank.items() if seqs]
        if last:
            seq, r = max(last, key=lambda x: x[0])
            e = view.by_rank[r][seq]
            group, op, t = "0", e.op, e.t_created
            detail += f" The survivors got as far as {op} #{seq} on the default group '0'."
    if blocked:
        detail += f" {fmt_ranks(blocked)} {'is' if len(blocked) == 1 else 'are'} blocked waiting for them."
    return Finding("missing_dump", no_dump, group=group, seq=seq, op=op, t=t, detail=detail,
                   evidence={"blocked": blocked})


def _missing_ranks(d: Divergence, idle: list[int], ts: TraceSet, pending: dict[int, list[Entry]]) -> Finding:
    detail = (f"{fmt_ranks(d.present)} issued {d.op} #{d.seq} on {fmt_group(d.group)}; "
              f"{fmt_ranks(idle)} never did. " + "; ".join(describe_rank(r, ts.ranks.get(r), pending.get(r, []))
                                                         for r in idle) + ".")
    evidence = {"issued_by": d.present, "last": {}, "now": {}}
    for r in idle:
        t = ts.ranks.get(r)
        e = last_completed(t) if t else None
        if e is not None:
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
