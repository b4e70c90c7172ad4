"""The verdict's guarantee: no rank blocked at dump time and no crashed rank goes unexplained.

After every analysis has spoken, each rank blocked in a collective or p2p (it has a pending entry, see
waitfor.py) and each rank that died of an exception must be accounted for: named in a finding's `ranks`, or a
consequence of a finding - it waits, directly or through other waiting ranks, for a rank that a finding names
(the finding first in the report wins: root cause first). Ranks nothing accounts for get a finding here,
"suspected, because ...", from what the wait-for graph shows about them, never silence:
- a wait chain that ends at ranks in no collective, or blocked in a call only they make (waitfor.py's
  rank-conditional calls), that no finding names: missing_ranks (they never issued the call the chain's last
  rank waits in);
- a chain that ends at a rank without a trace: missing_dump;
- ranks blocked in a call nothing visible holds up (every other member issued it, or no other member is known):
  stuck_collective;
- a crashed rank: crashed.
This runs until every such rank is accounted for (each round adds findings for the ranks left, which accounts
for them). Then every consequence points at its finding by index (`finding`) and by kind, group and seq
(`finding_ref`), and so does every rank's explanation (`explained_by`).
"""

from __future__ import annotations

import functools
from collections import deque

from distdoctor.collectives.names import backend_of
from distdoctor.diagnose.ended import p2p_ends
from distdoctor.diagnose.crash import (COMM_FAILURE, crash_findings, ended_by_signal, ended_on_their_own, killed_first,
                                      signal_of_its_own, signalled, stopped, unpacked_findings)
from distdoctor.diagnose.lead import sort_findings
from distdoctor.findings.kinds import Finding, fmt_group, fmt_ranks, numbered
from distdoctor.diagnose.match import GroupView
from distdoctor.diagnose.progress import describe_rank, shows_no_p2p
from distdoctor.diagnose.unseen_p2p import Unseen, unseen_finding
from distdoctor.diagnose.waitfor import Wait, completed_by_peers
from distdoctor.trace.model import Entry, TraceSet
from distdoctor.trace.summary import summarize


# Findings that mark the first place a group's members parted ways: every later collective on the group follows.
DIVERGENCE_KINDS = ("type_mismatch", "size_mismatch", "dtype_mismatch", "root_mismatch", "missing_ranks",
                    "state_mismatch", "stuck_collective")
P2P_OPS = ("send", "recv")


def _seq(e: Entry):
    return e.p2p_seq if e.is_p2p else e.seq


def program_name(entries: list[Entry]) -> str:
    """The name of one call the entries of several ranks record: the program's (a trace without a backend's
    prefix, the recorder's) where one has it, as a backend may record it under another name (Gloo: a
    reduce_scatter as all_reduce); else the first entry's."""
    return next((e.op for e in entries if backend_of(e.raw_op) is None), entries[0].op)


class Explainer:
    def __init__(self, ts: TraceSet, views: dict[str, GroupView], waits: list[Wait],
                 pending: dict[int, list[Entry]], crashes: dict[int, dict], alone: set[int] | None = None) -> None:
        self.ts, self.views, self.pending, self.crashes = ts, views, pending, crashes
        self.alone = alone or set()  # ranks blocked in a call only they make (waitfor.conditional_waits)
        self.on_way: set[int] = set()  # ranks ended from outside on their way to a call (diagnose/ended.py)
        self.hung = any(t.hang for t in ts.ranks.values())  # some rank's watchdog called the job hung
        self.waits_of: dict[int, list[Wait]] = {}
        for w in waits:
            self.waits_of.setdefault(w.rank, []).append(w)

    # ---- who explains whom --------------------------------------------------------------------------------
    def subjects(self) -> list[int]:
        """Ranks the verdict must account for: blocked at dump time, or crashed."""
        return sorted({r for r, es in self.pending.items() if es} | set(self.crashes))

    @staticmethod
    def named(findings: list[Finding]) -> dict[int, Finding]:
        out: dict[int, Finding] = {}
        for f in findings:
            for r in f.ranks:
                out.setdefault(r, f)
        return out

    def reaches(self, sources: list[tuple[Finding, list[int]]]) -> dict[int, Finding]:
        """rank -> the first (finding, ranks) of `sources` (in order) whose ranks it waits for, directly or through
        others. One walk of the reversed wait-for graph per source, in order, never past a rank an earlier one
        already reached (whoever waits for that rank reaches the earlier one too): linear in the graph."""
        waiters: dict[int, list[int]] = {}
        for r, ws in self.waits_of.items():
            for w in ws:
                for b in w.waits_for:
                    waiters.setdefault(b, []).append(r)
        out: dict[int, Finding] = {}
        for f, ranks in sources:
            todo = deque(r for q in ranks for r in waiters.get(q, ()))
            while todo:
                r = todo.popleft()
                if r in out:
                    continue
                out[r] = f
                todo.extend(waiters.get(r, ()))
        return out

    @staticmethod
    def divergences(findings: list[Finding]) -> dict[str, list[tuple[int, Finding]]]:
        """group -> (seq, finding) of the findings that mark where the group's members parted ways."""
        out: dict[str, list[tuple[int, Finding]]] = {}
        for f in findings:
            if f.kind in DIVERGENCE_KINDS and f.group is not None and f.seq is not None and f.op not in P2P_OPS:
                out.setdefault(f.group, []).append((f.seq, f))
        return out

    def after_divergence(self, rank: int, diverged: dict) -> Finding | None:
        """Once a group's members parted ways, every later collective on it is a consequence (match.py): the
        finding at the group's first divergence, when the rank is blocked after it."""
        for e in self.pending.get(rank, []):
            if e.is_p2p or e.seq is None:
                continue
            before = [(seq, f) for seq, f in diverged.get(e.group, []) if seq <= e.seq]
            if before:
                return min(before, key=lambda x: x[0])[1]
        return None

    def explain_all(self, findings: list[Finding]) -> tuple[list[Finding], dict[int, Finding]]:
        """Findings until every subject is accounted for; rank -> the finding that accounts for it: the finding
        naming it, else the first one naming a rank it waits for, else the divergence its group is blocked after,
        else the one that explains a rank it waits for."""
        subjects = self.subjects()
        for _ in range(len(subjects) + 1):  # each round names at least one rank left
            findings = sort_findings(findings)
            named = self.named(findings)
            by = {r: named[r] for r in subjects if r in named}
            reached = self.reaches([(f, f.ranks) for f in findings])
            by.update((r, reached[r]) for r in subjects if r not in by and r in reached)
            diverged = self.divergences(findings)
            after = {r: f for r in subjects if r not in by for f in [self.after_divergence(r, diverged)] if f}
            by.update(after)
            reached = self.reaches([(f, [r for r, g in after.items() if g is f]) for f in findings])
            by.update((r, reached[r]) for r in subjects if r not in by and r in reached)
            by.update((r, f) for r in subjects if r not in by for f in [self.through_blind(r, named)] if f)
            # waits into dumps that cannot show p2p: the finding that weighed them accounts for the waiters
            by.update((r, f) for f in findings if "no_p2p_in_dump" in f.evidence
                      for r in f.evidence["waiting"] if r in subjects and r not in by)
            # A communication failure (a peer closed the connection, a timeout) echoes a peer's crash or loss.
            by.update((r, f) for r in subjects if r not in by and r in self.crashes
                      and COMM_FAILURE.search(self.crashes[r]["text"]) for f in [self._gone_peer(r, findings)] if f)
            if findings:  # a rank stopped from outside (Ctrl-C) is accounted for by what the job was doing then
                by.update((r, findings[0]) for r in subjects if r not in by and r in self.crashes
                          and stopped(self.crashes[r]))
            left = [r for r in subjects if r not in by]
            if not left:
                return findings, by
            new = self.suspected(left, named)  # each names a rank left, or one a rank left waits for
            if not new:  # never seen; the guarantee holds even so
                new.append(Finding("stuck_collective", left, detail=(
                    f"Suspected, because {fmt_ranks(left)} {'is' if len(left) == 1 else 'are'} blocked or crashed "
                    f"and nothing else in the traces accounts for it."), evidence={"found_by": "wait-for graph"}))
            findings = findings + new
        raise AssertionError("explain: ranks left unexplained")  # unreachable: every round names a rank left

    def _gone_peer(self, rank: int, findings: list[Finding]) -> Finding | None:
        """The finding a rank's communication failure echoes: the first crash or loss, else the first rank found
        absent from a call on a group this rank shares with it (a peer that left: its connections closed; the
        rank may have failed inside a call its trace cannot show, one issued from C++)."""
        gone = next((f for f in findings if f.kind in ("crashed", "missing_dump")), None)
        if gone is not None:
            return gone
        mine = {name for name, v in self.views.items() if rank in v.members}
        return next((f for f in findings if f.kind == "missing_ranks" and any(
            r in self.views[g].members for g in mine for r in f.ranks if r != rank
            and not (r in self.ts.ranks and ended_by_signal(self.ts.ranks[r])))),
            None)  # a peer a signal ended: killed_first says so, as the crash it is


    # ---- findings for ranks nothing else explains ---------------------------------------------------------
    def suspected(self, left: list[int], named: dict[int, Finding]) -> list[Finding]:
        out: list[Finding] = []
        crashed = [r for r in left if r in self.crashes and not self.waits_of.get(r)]
        comm = {r: self.crashes[r] for r in crashed if COMM_FAILURE.search(self.crashes[r]["text"])}
        killed = killed_first(self.ts, comm) if comm else None
        if killed is not None:  # they lost the peer a signal ended first: that finding explains them next round
            out.append(killed)
            crashed = [r for r in crashed if r not in comm]
        unpacked = {r: self.crashes[r] for r in crashed if self.crashes[r].get("unpacking")}
        died_unpacking = unpacked_findings(self.ts, unpacked)  # a peer's other root or size, which no dump shows
        out.extend(died_unpacking)
        # the connections those ranks' deaths closed: their peers' failures echo them (next round, `_gone_peer`)
        out.extend(crash_findings(self.ts, {r: self.crashes[r] for r in crashed if r not in unpacked
                                            and not (died_unpacking and r in comm)}, set(), echoes=True))
        idle_at: dict[tuple, dict] = {}  # (group, seq, op) -> waiters, idle ranks, entry
        lost: set[int] = set()
        ended_wait = False  # a rank waits for ranks ended on their way: whatever ended the job explains it
        stuck: dict[tuple, list[int]] = {}
        unknown: dict[tuple, dict] = {}  # like idle_at, for peers whose dumps cannot show p2p
        for r in left:
            if r in crashed or (killed is not None and r in comm):
                continue
            if not self.waits_of.get(r):
                if r not in self.alone or not any(r in w.waits_for for q in left for w in self.waits_of.get(q, [])):
                    e = self.pending[r][0]  # (a rank alone in its call that others wait for is missing there)
                    # one collective, whatever each trace calls it (Gloo records a reduce_scatter as all_reduce)
                    stuck.setdefault((e.group, _seq(e), e.op if e.is_p2p else "", e.is_p2p), []).append(r)
                continue
            for w, sinks in self._sinks(r):
                for q in sinks:
                    if q in self.on_way:
                        ended_wait = True
                    elif q not in self.ts.ranks:
                        lost.add(q)
                    elif w.entry.is_p2p and q not in named and not self.pending.get(q) and \
                            shows_no_p2p(self.ts.ranks[q]):
                        got = unknown.setdefault((w.entry.group, _seq(w.entry), w.entry.op), {
                            "waiters": set(), "idle": set(), "entry": w.entry})
                        got["waiters"].add(w.rank)
                        got["idle"].add(q)
                    elif (not self.pending.get(q) or q in self.alone) and q not in named:
                        got = idle_at.setdefault((w.entry.group, _seq(w.entry), w.entry.op), {
                            "waiters": set(), "idle": set(), "entry": w.entry})
                        got["waiters"].add(w.rank)
                        got["idle"].add(q)
        # the first rank a signal ended: the others were ended after it, on their way. Not where a rank of the world
        # left no dump: it died of what let it write none (SIGKILL, SIGSEGV, an abort), a cause the lost-dump
        # finding names, and a launcher ends the survivors by signal after any rank died
        ended = signalled(self.ts) if ended_wait and not lost and not self._lost_anywhere() else None
        if ended is not None:
            out.append(ended)
        if lost:
            out.append(Finding("missing_dump", sorted(lost), detail=(
                f"{fmt_ranks(lost)} left no trace (crashed, killed, or never dumped), and other ranks wait for "
                f"{'it' if len(lost) == 1 else 'them'}."), evidence={"found_by": "wait-for graph"}))
        for (group, seq, op), got in sorted(idle_at.items(), key=lambda kv: str(kv[0])):
            e, idle = got["entry"], sorted(got["idle"])
            out.append(Finding(
                "missing_ranks", idle, group=group, seq=seq, op=op, t=e.t_created,
                detail=(f"Suspected, because {fmt_ranks(got['waiters'])} wait in {numbered(op, seq)} on "
                        f"{fmt_group(group, self._desc(group))} for {fmt_ranks(idle)}, which never joined it. "
                        + "; ".join(self._describe(q) for q in idle[:8]) + "."),
                evidence={"waiting": sorted(got["waiters"]), "found_by": "wait-for graph"}))
        out.extend(self._unknown_p2p(key, got, named) for key, got in sorted(unknown.items(), key=lambda kv: str(kv[0])))
        in_flight = []  # calls every member issued: one finding for all of them (a big job has one per group)
        for (group, seq, _, is_p2p), ranks in sorted(stuck.items(), key=lambda kv: str(kv[0])):
            e = self.pending[ranks[0]][0]
            op = program_name([self.pending[r][0] for r in ranks])
            if not is_p2p and self._all_issued(ranks[0], e):
                in_flight.append((group, seq, op, ranks, e))
            else:
                out.append(self._stuck(group, seq, op, is_p2p, ranks))
        if in_flight:
            out.append(self._in_flight(in_flight))
        return out

    def _lost_anywhere(self) -> bool:
        """A rank of the world left no dump."""
        return bool(self.ts.world_size) and any(r not in self.ts.ranks for r in range(self.ts.world_size))

    def _blind(self, q: int) -> bool:
        return q in self.ts.ranks and not self.pending.get(q) and shows_no_p2p(self.ts.ranks[q])

    def through_blind(self, rank: int, named: dict[int, Finding]) -> Finding | None:
        """A rank whose p2p wait ends at peers whose dumps cannot show p2p, on a group a member of which a
        finding names as stopped: the wait goes on where the dumps cannot see, to that member (the pipeline's
        stages wait for each other in turn); the finding accounts for it. None otherwise."""
        for w, sinks in self._sinks(rank):
            if not w.entry.is_p2p or not sinks or not all(self._blind(q) for q in sinks):
                continue
            view = self.views.get(w.entry.group)
            for m in view.members if view is not None else []:
                f = named.get(m)
                if f is not None and f.kind in ("missing_ranks", "crashed", "missing_dump"):
                    return f
        return None

    @functools.cached_property
    def _p2p_ends(self) -> tuple[dict, dict]:
        """What the ranks blocked in sends and receives say of their peers (ended.p2p_ends), read once."""
        return p2p_ends(self.ts, self.pending, self.crashes, self.hung)

    @functools.cached_property
    def _own_ends(self) -> set[int]:
        """The ranks the launcher's log says ended of a cause of their own (crash.ended_on_their_own), read once."""
        return set(ended_on_their_own(self.ts))

    @functools.cached_property
    def _first_signalled(self) -> int | None:
        """The first rank a signal ended, where no watchdog called the job hung: the stage the unseen sends and
        receives may wait for (a launcher's wave of SIGTERMs follows a first one by as little as the injected
        ones lead it, so it is a suspect, not the culprit)."""
        ended = min(((t.dump_time, r) for r, t in self.ts.ranks.items() if t.dump_time and signal_of_its_own(t)),
                    default=None)
        return None if ended is None or self.hung else ended[1]

    def _unknown_p2p(self, key: tuple, got: dict, named: dict[int, Finding]) -> Finding:
        """Ranks wait in p2p for peers whose dumps cannot show p2p (unseen_p2p.py)."""
        group, seq, op = key
        view = self.views.get(group)
        members = view.members if view is not None else sorted(self.ts.ranks)
        free = [m for m in members if m in self.ts.ranks and m not in named and not self.pending.get(m)]
        where = f"{numbered(op, seq)} on {fmt_group(group, self._desc(group))}"
        return unseen_finding(self.ts, Unseen(key, got["entry"], sorted(got["waiters"]), sorted(got["idle"]), free,
                                              where, self._first_signalled), self._p2p_ends, self._own_ends,
                              self._describe)

    def _describe(self, q: int) -> str:
        pend = self.pending.get(q) or []
        note = self.alone_reason(q, pend[0]) if pend else ""
        return describe_rank(q, self.ts.ranks.get(q), pend, note)

    def _all_issued(self, rank: int, e: Entry) -> bool:
        view = self.views.get(e.group)
        others = [m for m in view.members if m != rank] if view is not None else []
        return bool(others) and not completed_by_peers(rank, e, view, self.ts) and \
            all(e.seq in view.by_rank.get(m, {}) for m in others if m in self.ts.ranks)

    def _in_flight(self, calls: list[tuple]) -> Finding:
        """Ranks in collectives every member issued, which none completed: one finding, each call in evidence."""
        calls.sort(key=lambda c: (c[4].t_created if c[4].t_created is not None else float("inf"), c[0]))
        ranks = sorted({r for *_, rs, _ in calls for r in rs})
        group, seq, op, _, e = calls[0]
        where = "; ".join(f"{fmt_ranks(rs)} in {o} #{q} on {fmt_group(g, self._desc(g))}" for g, q, o, rs, _ in
                          calls[:3]) + (f"; and {len(calls) - 3} more groups" if len(calls) > 3 else "")
        detail = (f"Suspected, because {where}: every member issued {'it' if len(calls) == 1 else 'each'}, none "
                  f"completed it, and nothing in the traces holds {'it' if len(calls) == 1 else 'them'} up - the "
                  f"transport or a device hangs inside, or the dump was taken while they ran.")
        return Finding("stuck_collective", ranks, group=group, groups=sorted({c[0] for c in calls}), seq=seq, op=op,
                       t=e.t_created, detail=detail,
                       evidence={"found_by": "wait-for graph",
                                 "calls": [{"group": g, "seq": q, "op": o, "ranks": rs} for g, q, o, rs, _ in calls]})

    def _sinks(self, rank: int):
        """For each of the rank's waits, the ranks at the ends of its wait chains (they wait for nobody)."""
        for w in self.waits_of.get(rank, []):
            sinks, seen, todo = set(), {rank}, deque(w.waits_for)
            while todo:
                q = todo.popleft()
                if q in seen:
                    continue
                seen.add(q)
                nxt = [b for v in self.waits_of.get(q, []) for b in v.waits_for]
                if nxt:
                    todo.extend(nxt)
                else:
                    sinks.add(q)
            yield w, sinks

    def _desc(self, group: str) -> str:
        view = self.views.get(group)
        return view.desc if view is not None else ""

    def _stuck(self, group: str, seq, op: str, is_p2p: bool, ranks: list[int]) -> Finding:
        e = self.pending[ranks[0]][0]
        where = f"{numbered(op, seq)} on {fmt_group(group, self._desc(group))}"
        who = f"{fmt_ranks(ranks)} {'is' if len(ranks) == 1 else 'are'} blocked in {where}"
        detail = f"Suspected, because {who}, and " + self.alone_reason(ranks[0], e) + "."
        return Finding("stuck_collective", ranks, group=group, seq=seq, op=op, t=e.t_created, detail=detail,
                       evidence={"found_by": "wait-for graph", "members": self.views[group].members
                                 if group in self.views else None})

    def late_mark(self, rank: int) -> str:
        """A phrase when the rank's dump shows a collective in flight that every other member completed (the
        rank returned from it; its own mark lags), else ''."""
        trace = self.ts.ranks.get(rank)
        if trace is None:
            return ""
        for i in reversed(summarize(trace).not_done[-8:]):
            e = trace.entries[i]
            view = self.views.get(e.group)
            if e.seq is not None and not e.is_p2p and view is not None and completed_by_peers(rank, e, view, self.ts):
                return (f"its dump still shows {e.op} #{e.seq} on group '{e.group}' in flight, which every other "
                        f"member completed: it returned from it (Gloo marks completion late)")
        return ""

    def alone_reason(self, rank: int, e: Entry) -> str:
        """Why a rank in call `e` waits for nobody, in words."""
        if e.is_p2p:
            if e.peer is None:
                return "its peer is not known (a receive from any source)"
            return (f"rank {e.peer} posted the matching {'recv' if e.op == 'send' else 'send'}: nothing in the "
                    f"traces holds it up (the transport, or a dump taken while it ran)")
        view = self.views.get(e.group)
        others = [m for m in view.members if m != rank] if view is not None else []
        if not others and view is not None and not view.inferred:
            return (f"group '{e.group}' has no other member: nothing can hold it up (its completion mark lags, as "
                    f"Gloo's does, or the dump caught it in flight)")
        if not others:
            return (f"no other rank's trace shows group '{e.group}': its other members never called a collective "
                    f"on it, or left no trace (Gloo's dumps do not list group members) - a collective only some "
                    f"ranks call, such as one on a group made with new_group for metrics")
        never = [m for m in others if m in self.ts.ranks and not view.by_rank.get(m)]
        if never and len(never) == len(others):
            return (f"no other member ({fmt_ranks(others)}) ever issued a collective on "
                    f"{fmt_group(e.group, view.desc)}: a call only some ranks make (rank-conditional code, such as "
                    f"logging on one rank through a group made with new_group), unless the others would make it "
                    f"later (then the ranks call collectives in different orders)")
        if view is not None and completed_by_peers(rank, e, view, self.ts):
            return (f"{fmt_ranks(others)} completed it (the rank's own dump had not marked it completed yet: "
                    f"Gloo marks completion late)")
        absent = [m for m in others if m in self.ts.ranks and e.seq is not None
                  and e.seq not in (view.by_rank.get(m) or {})]
        if absent:  # waits for them read as those of a call only some ranks make (waitfor.conditional_waits)
            later = [m for m in absent if m not in never]
            said = ([f"{fmt_ranks(never)} never issued a collective on {fmt_group(e.group, view.desc)}"] if never
                    else []) + ([f"{fmt_ranks(later)} never issued this one"] if later else [])
            return (", and ".join(said) + ": a call only some ranks make, unless the others would make it later "
                    "(then the ranks call collectives in different orders)")
        return (f"every other member ({fmt_ranks(others)}) issued it too: nothing in the traces holds it up - the "
                f"transport or a device hangs inside it, or the dump was taken while it ran")


def consequences_of(ex: Explainer, findings: list[Finding], by: dict[int, Finding],
                    earlier: list[dict]) -> list[dict]:
    """The consequence records, each pointing at the finding that explains it: the ones the analyses filed
    (resolved through "_ref", else through their ranks; one that resolves to nothing is dropped: its ranks are
    neither blocked nor crashed, or they are accounted for below), then one per blocked or crashed rank that no
    finding names, grouped by the call they wait in."""
    index = {id(f): i for i, f in enumerate(findings)}
    named = ex.named(findings)
    out: list[dict] = []
    for c in earlier:
        ref = c.pop("_ref", None)
        f = ref if ref is not None and id(ref) in index else None
        if f is None:
            f = min((by.get(r) or named.get(r) for r in c["ranks"] if by.get(r) or named.get(r)),
                    key=lambda x: index[id(x)], default=None)
        if c.pop("_not_its_own", False) and f is not None:  # (a rank ended on its way that the finding names)
            c["ranks"] = [r for r in c["ranks"] if r not in set(f.ranks)]
        if f is None or not c["ranks"]:
            continue
        out.append(_point(c, f, index))
    grouped: dict[tuple, dict] = {}
    culprits: dict[int, set] = {}  # per finding, its ranks as a set (a finding may name 16 384 ranks)
    for r in ex.subjects():
        f = by[r]
        if id(f) not in culprits:
            culprits[id(f)] = set(f.ranks)
        if r in culprits[id(f)]:
            continue
        waits = ex.waits_of.get(r, [])
        e = waits[0].entry if waits else ex.pending[r][0] if ex.pending.get(r) else ex.crashes[r].get("in_call")
        where = (e.group, _seq(e), e.op) if e is not None else (None, None, None)
        blockers = sorted({b for w in waits for b in w.waits_for})
        key = (*where, id(f), e is None)
        got = grouped.get(key)
        if got is None:
            got = grouped[key] = {"kind": "blocked" if e is not None else "crashed", "group": where[0],
                                  "seq": where[1], "op": where[2], "ranks": [], "waits_for": set(), "crashed": []}
        got["ranks"].append(r)
        got["waits_for"].update(blockers)
        if r in ex.crashes:
            got["crashed"].append(r)
        got["_f"] = f
    for got in grouped.values():
        f = got.pop("_f")
        waits_for, crashed = sorted(got.pop("waits_for")), got.pop("crashed")
        because = (f"waiting for {fmt_ranks(waits_for)}" if waits_for else
                   f"its connection to {fmt_ranks(f.ranks)} failed" if f.kind in ("crashed", "missing_dump") else
                   f"blocked after group '{got['group']}' parted ways at {f.op} #{f.seq}")
        if crashed and got["kind"] == "crashed":
            because = f"{because}: {ex.crashes[crashed[0]]['text'][:120]}"
        elif crashed:
            because += f"; {fmt_ranks(crashed)} then failed inside it ({ex.crashes[crashed[0]]['text'][:120]})"
        got["because"] = because
        got["waits_for"] = waits_for
        out.append(_point(got, f, index))
    return out


def _point(c: dict, f: Finding, index: dict[int, int]) -> dict:
    c["finding"] = index[id(f)]
    c["finding_ref"] = {"kind": f.kind, "group": f.group, "seq": f.seq}
    return c
