"""Run every analysis over a TraceSet and rank the findings root cause first, without cascades.

Order of reasoning:
1. wait-for graph (waitfor.py): cycles are deadlocks (order_deadlock, p2p_deadlock); they explain every
   missing rank and stuck state on their groups. A cycle within one number of one group is no order but
   different calls there: a type_mismatch (one_number.py).
2. ranks that died of an exception on their own (crash.py): crashed; ranks of the world without a trace:
   missing_dump (lost.py), after a rank whose call sites show it skipped or added a call (parted.py). The
   survivors' waits on them are consequences, and so is a cycle whose every wait also waits for a rank that
   crashed on its own (its victims: none of its calls could complete whatever the order).
3. per-group first divergence (match.py): mismatches are findings. An absent rank that waits for other ranks
   in another call is a consequence (its own wait is reported where it waits); absent ranks that wait for
   nobody (stuck in Python: a data loader, a sleep, an exit path; or alone in a call nobody else issued)
   become missing_ranks, described by what they did last and their current stack when the trace has one.
   State divergences on groups with lost members are consequences of the loss.
4. stragglers, only when nothing hangs.
5. per-rank logs (threads.py): threads inside an op they never finished, as stuck_thread findings after
   the others.
6. the guarantee (explain.py): every rank blocked at dump time and every crashed rank is named in a finding or
   is a consequence pointing at the finding that explains it; what nothing explains gets a finding there.
7. where in the user's code (sites.py): every finding names the call sites of the calls it is about.
0. NCCL (nccl_frontier.py): where each rank's CPU and GPU stand per group (pg_status) name the ranks whose GPU or
   CPU stopped, first; a rank is blocked only where it waits for another (a collective every member reached runs
   on the GPU), a stream is a process group, and a cycle across groups (the CPU's order) is no deadlock.
8. where each stream stands, when the traces say it (streams.py; the simulator's do): the wait-for graph over
   (rank, stream) is exact there, its findings come first, and what the graph of ranks made of the same
   blocked ranks (a deadlock through an event or a buffer slot reads there as ranks missing from the next
   call) becomes a consequence of them.
Findings sort by kind priority (findings.PRIORITY), then by when their evidence happened."""

from __future__ import annotations

from dataclasses import dataclass, field

from distdoctor.diagnose import hang_status, nccl_frontier, p2p, streams
from distdoctor.diagnose.crash import crash_findings, crashed_ranks, killed_absent, signalled, stopped
from distdoctor.diagnose.ended import on_its_way, way_because
from distdoctor.diagnose.explain import Explainer, consequences_of, sort_findings
from distdoctor.findings.kinds import Finding, fmt_group, fmt_ranks, group_desc
from distdoctor.diagnose.callsites import callsite_divergence
from distdoctor.diagnose.lost import hedge_lost, missing_dump
from distdoctor.diagnose.next_call import lone_next_call
from distdoctor.diagnose.one_number import same_number
from distdoctor.diagnose.parted import odd_message_before_lost, parted_before_lost
from distdoctor.diagnose.match import ROOTED, Divergence, GroupView, build_views
from distdoctor.diagnose.siblings import all_divergences
from distdoctor.diagnose.progress import (describe_rank, is_gloo_fr, last_completed, probably_inside,
                                         rank_progress, where_now)
from distdoctor.diagnose.rankstate import rank_states
from distdoctor.diagnose.sites import annotate
from distdoctor.diagnose.p2p_lateness import find_p2p_stragglers
from distdoctor.diagnose.straggler import find_stragglers, split_untold
from distdoctor.diagnose.unseen import blind_detail
from distdoctor.diagnose.unseen_p2p import stopped_in_hang
from distdoctor.diagnose.threads import thread_findings
from distdoctor.diagnose.waitfor import Cycle, Wait, build_waits, conditional_waits, find_cycles, on_possible_cycle
from distdoctor.findings.sentences import describe_cycle
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
    undecided: str | None = None  # why these traces cannot support a verdict, when they cannot (no_calls)
    unconfirmed: list[Finding] = field(default_factory=list)  # stragglers whose role the dumps cannot tell

    @property
    def verdict(self) -> str:
        """`problem` with a finding; `in_flight` with none while some rank's GPU is inside calls every member
        reached (NCCL: nothing in the dumps holds them up, but nothing shows they end either: a dump taken while
        the job ran, or a hang inside the transport or a device); `undecided` with none when no rank's trace holds
        a single call (nothing to judge: an OK would be a claim without evidence); else `ok`."""
        if self.findings:
            return "problem"
        return "in_flight" if self.in_flight_ranks() else "undecided" if self.undecided else "ok"

    def in_flight_ranks(self) -> list[int]:
        return sorted(int(r) for r, p in self.ranks.items() if p.get("state") == "in_flight")

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
            "groups": {name: {"members": v.members, "inferred": v.inferred, "desc": group_desc(v.desc)}
                       for name, v in sorted(self.views.items())},
            "hang": hang_status.summarize(self.traces),
            **({"undecided": self.undecided} if self.undecided else {}),
            **({"retired_in_flight": self.traces.refuted} if self.traces.refuted else {}),
            **({"launcher": self.traces.launch.to_json()} if self.traces.launch is not None else {}),
            **({"unconfirmed": [f.to_json() for f in self.unconfirmed]} if self.unconfirmed else {}),
        }


def analyze(ts: TraceSet) -> Report:
    views = build_views(ts)
    standing = nccl_frontier.prepare(ts, views)  # NCCL: where each rank's CPU and GPU stand; None otherwise
    nccl = standing is not None
    waits, pending = build_waits(ts, views, standing.p2p if standing else None)
    waits += hang_status.header_waits(ts, views, pending)  # calls only the recorder's watchdog saw
    cycles = _cycles(waits, nccl)
    conditional = conditional_waits(waits, cycles, views, ts) if cycles else []
    if conditional:  # calls only some ranks make: the others wait for those ranks, no order was swapped
        waits = [w for w in waits if not any(w is c for c in conditional)]
        cycles = _cycles(waits, nccl)
    # NCCL: a rank is blocked only where it waits for another; the calls running on the GPU, the waits that prove
    # nothing (and why), the ranks whose GPU still runs work. Unchanged, empty and empty otherwise.
    waits, pending, in_flight, behind, busy = nccl_frontier.split_waits(ts, views, standing, waits, pending,
                                                                         {r for c in cycles for r in c.ranks})
    crashes = crashed_ranks(ts)
    explainer = Explainer(ts, views, waits, pending, crashes, {w.rank for w in conditional})
    findings: list[Finding] = nccl_frontier.findings(ts, views, standing) if standing else []
    frontier_findings = list(findings)
    consequences: list[dict] = []

    findings.extend(counted := p2p.count_disagreements(cycles, explainer.waits_of))
    for c in cycles:
        if not c.p2p_only and not any(set(f.ranks) <= set(c.ranks) for f in counted):
            findings.append(same_number(c, views) or _order_deadlock(c, views))
    findings.extend(p2p.cycle_findings(cycles, ts, explainer.waits_of))
    findings.extend(p2p.pair_disagreements(ts))
    on_cycle = {r for c in cycles for r in c.ranks}
    cycle_finding = {r: f for f in findings for r in f.ranks if f.kind in ("order_deadlock", "p2p_deadlock")}
    waiting = {w.rank for w in waits}  # ranks blocked in a call that waits for other ranks
    crash_fs = crash_findings(ts, crashes, waiting)
    findings.extend(crash_fs)
    crash_finding = {r: f for f in crash_fs for r in f.ranks}
    findings = _victims_cycles(cycles, findings, crash_finding, consequences)
    cycle_finding = {r: f for f in findings for r in f.ranks if f.kind in ("order_deadlock", "p2p_deadlock")}

    world = range(ts.world_size or 0)
    no_dump = [r for r in world if r not in ts.ranks]
    lost_finding = None
    if no_dump:
        lost_finding = missing_dump(no_dump, waits, views, ts)
        findings.append(lost_finding)
        findings.extend(parted_before_lost(views, no_dump, ts))  # a skip the call sites show cost a peer its dump
        findings.extend(odd_message_before_lost(ts, no_dump))  # so does an odd message

    divs = all_divergences(ts, views)
    parted = {d.group: d.seq for d in divs if d.kind != "state_mismatch"}  # where each group parted ways

    def after_parting(r: int) -> bool:
        """Blocked in a collective of a group after it parted ways: that divergence holds it, not the rank."""
        return any(e.seq is not None and not e.is_p2p and e.group in parted and e.seq > parted[e.group]
                   for e in pending.get(r, []))

    for d in divs:
        if d.kind in MISMATCHES:
            findings.append(_from_divergence(d, views))
        elif d.kind == "missing_ranks":
            if len(d.present) == 1 and (lone := lone_next_call(ts, views, d.group, d.seq, d.present[0])):
                findings.append(lone)  # its group's and the sibling groups' other members all went elsewhere
            # Absent ranks waiting for others are where the wave of waiting reached, not where it began; a rank
            # in a call that waits for nobody (alone on its group, or shown in a call its peers completed) is not.
            idle = [r for r in d.ranks if r not in waiting and r not in on_cycle and not after_parting(r)
                    and r not in busy]  # NCCL: a CPU behind whose GPU still runs will get there
            # A rank that died of a communication failure (a peer closed its connection) before it issued the call
            # is an echo of the lost peers, not an absent rank of its own: the explainer names it (as crashed if
            # nothing else explains it). A rank stopped from outside (Ctrl-C) where it stood is absent all the same.
            echoes = [r for r in idle if r in crashes and r not in crash_finding and not stopped(crashes[r])]
            idle = [r for r in idle if r not in echoes]
            on_way = {r: away for r in idle if (away := on_its_way(ts, views[d.group], r, d.seq, d.present,
                                                                   crashes, explainer.hung)) is not None}
            idle = [r for r in idle if r not in on_way]
            explainer.on_way.update(on_way)
            if on_way:
                consequences.append({"kind": d.kind, "group": d.group, "seq": d.seq, "op": d.op,
                                     "ranks": sorted(on_way), "because": way_because(on_way), "_ref": lost_finding,
                                     "_not_its_own": True})  # a rank the finding names is no victim of it
            crashed = [r for r in idle if r in crash_finding]
            call = views[d.group].by_rank[d.present[0]][d.seq]
            recorded = _recorded_by_recorder(views[d.group], d.seq)  # a Python call: its trace would show it
            unseen = [r for r in idle if r not in crash_finding and not recorded
                      and probably_inside(ts.ranks.get(r), call)]
            idle = [r for r in idle if r not in crash_finding and r not in unseen]
            explained = [r for r in d.ranks if r not in idle and r not in crashed and r not in unseen
                         and r not in echoes and r not in on_way]
            if unseen:
                consequences.append({"kind": d.kind, "group": d.group, "seq": d.seq, "op": d.op, "ranks": unseen,
                                     "because": "only a recorder trace, which cannot show this call (issued from "
                                                "C++), and the main thread is inside torch: probably in it"})
            for r in crashed:
                _survivors_wait(crash_finding[r], d, views)
            if crashed:
                consequences.append({"kind": d.kind, "group": d.group, "seq": d.seq, "op": d.op, "ranks": crashed,
                                     "because": "those ranks crashed", "_ref": crash_finding[crashed[0]]})
            if echoes:
                consequences.append({"kind": d.kind, "group": d.group, "seq": d.seq, "op": d.op, "ranks": echoes,
                                     "because": "those ranks died of a communication failure first"})
            if idle:
                findings.append(_missing_ranks(d, idle, explained, ts, pending, views, explainer))
                hedge_lost(lost_finding, d, idle, views[d.group], no_dump, pending, ts)
            elif explained and not crashed and not unseen:
                consequences.append({"kind": d.kind, "group": d.group, "seq": d.seq, "op": d.op, "ranks": d.ranks,
                                     "because": "those ranks are blocked in other collectives"})
        elif d.kind == "state_mismatch":
            members = views[d.group].members
            lost = [r for r in members if r not in ts.ranks]
            held = [cycle_finding[r] for r in d.ranks if r in cycle_finding]
            if lost or held:
                consequences.append({"kind": d.kind, "group": d.group, "seq": d.seq, "op": d.op, "ranks": d.ranks,
                                     "because": "members were lost" if lost else "a deadlock cycle holds them",
                                     "_ref": lost_finding if lost else held[0]})
            else:
                findings.append(_from_divergence(d, views))
    findings.extend(p2p.unposted_peers(ts, waits, pending, on_cycle))
    untold: list[Finding] = []  # a lateness its role may explain, which these dumps cannot time: no claim
    if not findings and not explainer.subjects():
        findings, untold = split_untold(find_stragglers(views))
        findings += find_p2p_stragglers(ts, {r for f in findings + untold for r in f.ranks})

    findings = _one_finding_per_absent_rank(sort_findings(findings), consequences)
    findings = _streams_first(ts, findings, consequences)
    findings = _frontiers_first(frontier_findings, findings, consequences)
    if behind:  # NCCL: p2p waits nobody can be blamed for alone
        findings += nccl_frontier.unshown_pairs(behind, {r for f in findings for r in f.ranks}, views)
    stuck, thread_ranks = thread_findings(ts, others_found=bool(findings))  # per-rank logs: threads inside an op
    findings += stuck  # after the collective findings, in their own order (strongest first)
    findings, explained_by = explainer.explain_all(findings)
    if all(f.kind == "straggler" for f in findings) and (ended := stopped_in_hang(ts) or signalled(ts)) is not None:
        findings.insert(0, ended)  # a rank stopped in a hang, or a signal ended, nothing else found: never OK
    consequences = consequences_of(explainer, findings, explained_by, consequences)
    annotate(findings, ts, views, pending)
    progress = {r: rank_progress(t, pending.get(r, []) + in_flight.get(r, [])) for r, t in ts.ranks.items()}
    if standing is not None:
        nccl_frontier.add_progress(progress, standing)
    states = rank_states(ts, explainer, findings, explained_by, on_cycle, in_flight, behind)
    for r, p in progress.items():
        p.update(states[r])
    missing = {"missing": True, "state": "no_trace"}  # one object for every absent rank: a corrupt rank number can
    ranks = {str(r): progress.get(r, missing) for r in sorted(set(progress).union(no_dump))}  # imply a huge world
    for r, extra in thread_ranks.items():  # per-rank logs: "threads" and "log"
        ranks[str(r)].update(extra)
    return Report(ts, findings, ranks, ts.world_size, waits, cycles, consequences, views, no_calls(ts), untold)


def no_calls(ts: TraceSet) -> str | None:
    """Why these traces cannot show the job's state, when no rank's trace holds a single call: every rank dumped,
    none recorded anything. A job that stopped (a hang, a crash, a rank that exited) before its first collective
    looks so, and so does one whose calls the dumps do not record (Gloo's Flight Recorder keeps no send/recv: a
    pipeline stuck in its sends and receives); a healthy job that ran reaches at least its closing barrier."""
    if not ts.ranks or any(len(t.entries) or t.log is not None for t in ts.ranks.values()):
        return None
    ranks = fmt_ranks(sorted(ts.ranks))
    why = f"no rank's trace holds a single call ({ranks} dumped, each with nothing recorded)"
    if any(t.source.startswith("flight_recorder") and not t.comm_lib_version for t in ts.ranks.values()):
        why += ("; these Flight Recorder dumps name no NCCL version (Gloo's, which record no send/recv: a job that "
                "only sent and received, a pipeline, leaves them empty whether it ran, hung or crashed)")
    return why + (". These dumps cannot tell whether the job was stuck or which rank stopped it: one of "
                  f"{ranks}, or none (the distdoctor recorder's traces, or `distdoctor run`, show the calls).")


def _streams_first(ts: TraceSet, findings: list[Finding], consequences: list[dict]) -> list[Finding]:
    """The findings of the graph of streams first; the others about only ranks it holds are consequences."""
    exact, held = streams.analyze(ts)
    if not exact:
        return findings
    kept = []
    for f in findings:
        if f.ranks and set(f.ranks) <= held and f.kind not in ("crashed", "missing_dump"):
            consequences.append({"kind": f.kind, "group": f.group, "seq": f.seq, "op": f.op, "ranks": f.ranks,
                                 "because": "their streams wait as the stream findings say", "_ref": exact[0]})
        else:
            kept.append(f)
    return exact + kept


def _frontiers_first(exact: list[Finding], findings: list[Finding], consequences: list[dict]) -> list[Finding]:
    """NCCL's frontiers name the stopped ranks: what the calls alone made of the same ranks (absent from the next
    collective, still in one, on a cycle) is what their stop did to the others."""
    culprits = {r for f in exact for r in f.ranks}
    kept = []
    for f in findings:
        if any(f is x for x in exact) or f.kind in MISMATCHES or not f.ranks or not set(f.ranks) <= culprits:
            kept.append(f)
            continue
        ref = next(x for x in exact if set(f.ranks) & set(x.ranks))
        consequences.append({"kind": f.kind, "group": f.group, "seq": f.seq, "op": f.op, "ranks": f.ranks,
                             "because": f"their {ref.kind.split('_')[0].upper()} stopped", "_ref": ref})
    return kept


def _cycles(waits: list[Wait], nccl: bool = False) -> list[Cycle]:
    """Cycles of waits; under NCCL only those within one process group: its stream runs collectives in order,
    while the order of calls across groups is the CPU's, which the GPU does not follow."""
    cycles = find_cycles(on_possible_cycle(waits))
    return [c for c in cycles if len(set(c.groups)) == 1] if nccl else cycles


def _victims_cycles(cycles: list[Cycle], findings: list[Finding], crash_finding: dict[int, Finding],
                    consequences: list[dict]) -> list[Finding]:
    """A cycle whose every wait also waits for a rank that crashed on its own is no cause: none of its calls could
    complete whatever the order, and its ranks are the crash's victims (they then die of the closed connection or
    the launcher's SIGTERM). Its finding becomes a consequence of the crash, which comes first."""
    for c in cycles:
        if c.p2p_only:
            continue
        causes = [next((crash_finding[b] for b in w.waits_for if b in crash_finding), None) for _, _, w in c.steps]
        if not all(causes):
            continue
        f = next((f for f in findings if f.kind == "order_deadlock" and f.ranks == sorted(set(c.ranks))), None)
        if f is None:
            continue
        findings = [x for x in findings if x is not f]
        consequences.append({"kind": f.kind, "group": f.group, "seq": f.seq, "op": f.op, "ranks": f.ranks,
                             "because": "their calls also wait for a rank that crashed first: a cycle among its "
                                        "victims", "_ref": causes[0]})
    return findings


def _survivors_wait(f: Finding, d: Divergence, views: dict[str, GroupView]) -> None:
    """A crashed rank's finding also says where the others wait for it (the first such collective)."""
    if "others_wait_in" in f.evidence:
        return
    f.evidence["others_wait_in"] = {"group": d.group, "seq": d.seq, "op": d.op, "ranks": d.present}
    f.detail += (f" {fmt_ranks(d.present)} wait for {'it' if len(f.ranks) == 1 else 'them'} in {d.op} #{d.seq} on "
                 f"{fmt_group(d.group, views[d.group].desc)}.")
    f.group, f.groups, f.seq, f.op = d.group, [d.group], d.seq, d.op  # where the crash stopped the others


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
                             "because": "the same ranks are already missing from an earlier collective",
                             "_ref": seen[next(r for r in f.ranks if r in seen)]})
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


def _order_deadlock(c: Cycle, views: dict[str, GroupView]) -> Finding:
    first = c.path[0].why.entry
    detail = (f"{fmt_ranks(c.ranks)} wait for each other across groups {', '.join(repr(x) for x in c.groups)}: "
              f"their collectives were issued in different orders. Cycle: {describe_cycle(c.path)}.")
    for a, b, w in c.steps:  # a wait for ranks that never used the group at all: maybe a call only some ranks make
        view = views.get(w.entry.group)
        never = [r for r in w.waits_for if view is not None and r in view.by_rank and not view.by_rank[r]]
        if never and w.entry.seq == 1:
            detail += (f" {fmt_ranks(never)} never issued any collective on {fmt_group(view.name, view.desc)}: rank "
                       f"{a}'s {w.entry.op} #1 there may be a call only some ranks make (e.g. metrics on a group "
                       f"made with new_group).")
            break
    return Finding("order_deadlock", c.ranks, group=first.group, groups=c.groups, seq=first.seq, op=first.op,
                   t=first.t_created, detail=detail,
                   evidence={"cycle": [{"rank": a, "waits_for": b, "group": w.entry.group, "seq": w.entry.seq,
                                        "op": w.entry.op} for a, b, w in c.steps]})


def _recorded_by_recorder(view, seq: int) -> bool:
    """Whether some member's recorder recorded collective `seq` (its entry keeps no backend prefix): a call
    issued from Python, which every rank's recorder sees when it issues it."""
    return any(":" not in (e.raw_op or "") for by in view.by_rank.values() for e in [by.get(seq)] if e is not None)


def _missing_ranks(d: Divergence, idle: list[int], explained: list[int], ts: TraceSet,
                   pending: dict[int, list[Entry]], views: dict[str, GroupView], explainer: Explainer) -> Finding:
    if (killed := killed_absent(ts, idle, d.present, explainer.crashes)) is not None:
        return killed  # a signal ended it before the members in the call failed talking to it
    notes = {r: explainer.alone_reason(r, pending[r][0]) if pending.get(r) else explainer.late_mark(r) for r in idle}
    detail = (f"{fmt_ranks(d.present)} issued {d.op} #{d.seq} on {fmt_group(d.group, views[d.group].desc)}; "
              f"{fmt_ranks(idle)} never did. " + "; ".join(
                  describe_rank(r, ts.ranks.get(r), pending.get(r, []), notes.get(r, "")) for r in idle) + ".")
    evidence = {"issued_by": d.present, "last": {}, "now": {}}
    for r in idle:
        t = ts.ranks.get(r)
        e = last_completed(t) if t else None
        if e is not None:
            evidence["last"][str(r)] = {"group": e.group, "seq": e.seq, "op": e.op}
        now = where_now(t) if t else None
        if now:
            evidence["now"][str(r)] = now
    f = Finding("missing_ranks", idle, group=d.group, seq=d.seq, op=d.op, t=d.t, detail=detail, evidence=evidence)
    for r in idle:
        site = callsite_divergence(views[d.group], r, d.seq)
        if site:
            f.detail += (f" Rank {r}'s call sites part from the others' at {site['op']} #{site['seq']}: "
                         f"it called from {site['rank_site']} where {fmt_ranks(site['others'])} called "
                         f"from {site['others_site']}.")
            f.evidence.setdefault("callsite_divergence", {})[str(r)] = site
    if any(ts.ranks.get(r) is not None and ts.ranks[r].source.startswith("flight_recorder") for r in idle) and \
            any(is_gloo_fr(t) for t in ts.ranks.values()):
        f.detail += (" (Gloo's Flight Recorder does not record send/recv: a rank blocked in p2p looks idle "
                     "in these dumps; the distdoctor recorder's traces show it.)")
    if explained:
        f.detail += f" ({fmt_ranks(explained)} also never issued it, but are blocked elsewhere.)"
    if d.evidence.get("blind"):
        f.detail += " " + blind_detail(d.evidence["blind"], fmt_group(d.group, views[d.group].desc), d.op)
        f.evidence["blind"] = d.evidence["blind"]
    return f


def _from_divergence(d: Divergence, views: dict[str, GroupView]) -> Finding:
    group = fmt_group(d.group, views[d.group].desc)
    if d.kind == "state_mismatch" and d.evidence.get("blind"):
        detail = f"one of {fmt_ranks(d.ranks)}: " + blind_detail(d.evidence["blind"], group, d.op)
    elif d.kind == "state_mismatch":
        detail = (f"{d.op} #{d.seq} on {group} completed on {fmt_ranks(d.evidence['completed'])} "
                  f"but {fmt_ranks(d.ranks)} {'is' if len(d.ranks) == 1 else 'are'} still in it.")
        later = d.evidence.get("then_absent_from")
        if later:
            detail += f" The others went on to {later['op']} #{later['seq']}, which {fmt_ranks(later['ranks'])} never reached."
        if d.op in ROOTED and d.seq in views[d.group].by_rank.get(d.evidence["completed"][0], {}) and \
                views[d.group].by_rank[d.evidence["completed"][0]][d.seq].root is None:
            detail += (f" These traces record no {d.op} roots (Flight Recorder does not): a root that differs "
                       f"between ranks (e.g. broadcast_object_list(src=...) from a per-rank config) completes a "
                       f"{d.op} on some ranks only; the distdoctor recorder's traces show the roots.")
    else:
        what = d.kind.split("_")[0]
        verb = {"type": "issued a different collective", "size": "passed different sizes",
                "dtype": "passed a different dtype", "root": "named a different root"}[what]
        than = "its sibling groups' members" if d.evidence.get("lost_peers") else "the other members"
        detail = f"at {d.op} #{d.seq} on {group} {fmt_ranks(d.ranks)} {verb} than {than}: {d.detail}."
        if d.evidence.get("tie", {}).get("undecided"):
            detail = (f"one of {fmt_ranks(d.ranks)}: at {d.op} #{d.seq} on {group} "
                      f"{'' if d.evidence.get('lost_peers') else 'the members disagree: '}{d.detail}.")
    return Finding(d.kind, d.ranks, group=d.group, seq=d.seq, op=d.op, t=d.t, detail=detail, evidence=d.evidence)

