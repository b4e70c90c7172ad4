"""Run a program and turn the engine's state into the report: the JSON contract and the text verdict.

JSON (`distdoctor sim run FILE --format json`):
    {"deadlock", "cycle": [{"rank", "stream", "op_index", "op", "waits_for": [...]}],
     "blocked": [{"rank", "stream", "op_index", "op"}], "makespan_us",
     "streams": {"<rank>/<stream>": {"busy_us", "wait_us", "idle_us"}}, "bubble_fraction",
     "buffers": {"<rank>/<buffer>": {"capacity", "peak"}}, "explanation": [...], "mismatches": [...],
     "crossed_messages": [...],
     "other_cycles": [...], "other_cycles_count", "ops", "ops_executed", "timing" (with --trials),
     "findings": [...]}
`findings` are diagnose's (distdoctor/findings/kinds.py, same JSON schema): the deadlock's cycle
(stream_deadlock, order_deadlock or p2p_deadlock) and what nothing can free (stream_starved, missing_ranks),
built from the one wait-for graph over (rank, stream); desyncs (type_mismatch, size_mismatch) and crossed_p2p.
`bubble_fraction` is the mean over ranks (that have compute) of the fraction of the makespan during which
none of their compute streams (streams with at least one `compute` op) is busy: idle or waiting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distdoctor.findings.kinds import Finding
from distdoctor.findings.sentences import MAX_CYCLE_FINDINGS, describe_cycle, starvation_sentence, stream_findings
from distdoctor.findings.waitfor import Edge, Node, Starved, analyze_streams
from distdoctor.report.findings import finding_lines, findings_json
from distdoctor.sim.engine import RunState, compile_program, jittered, run
from distdoctor.sim.ir import Program, label
from distdoctor.sim.waitfor import stream_states
from distdoctor.trace.model import StreamState


_DESYNC = ("type_mismatch", "size_mismatch", "crossed_p2p")  # findings of a run that may well finish


@dataclass
class SimResult:
    state: RunState
    cycle: list[Edge]
    edges: dict[Node, list[Edge]]  # the wait-for graph over (rank, stream)
    starved: dict[Node, Starved]
    more_cycles: list[list[Node]]  # further cycles disjoint from `cycle`
    states: dict[Node, StreamState] | None = None  # where each stream stands (a deadlocked run)
    timing: Timing | None = None

    def sid(self, node: Node) -> int:
        return self.state.compiled.sid_of[node]

    @property
    def program(self) -> Program:
        return self.state.compiled.program

    @property
    def deadlock(self) -> bool:
        return self.state.deadlock

    def _where(self, sid: int, idx: int) -> dict:
        r, s = self.state.compiled.streams[sid]
        op = self.program.ranks[r].streams[s][idx]
        return {"rank": r, "stream": s, "op_index": idx, "op": label(op)}

    def bubble_fraction(self) -> float:
        rs = self.state
        c = rs.compiled
        if rs.makespan <= 0:
            return 0.0
        busy_by_rank: dict[int, float] = {}
        for sid in c.compute_sids:
            r = c.rank_of[sid]
            busy_by_rank[r] = rs.busy_union[r] if r in rs.busy_union else rs.busy[sid]
        if not busy_by_rank:
            return 0.0
        return sum(1.0 - b / rs.makespan for b in busy_by_rank.values()) / len(busy_by_rank)

    def explanation(self) -> list[str]:
        if not self.deadlock:
            return []
        lines = []
        if self.cycle:
            lines.append(describe_cycle(self.cycle, self.states))
        for node, why in sorted(self.starved.items(), key=lambda x: self.sid(x[0])):
            lines.append(starvation_sentence(node, self.states[node], why))
        return lines

    def findings(self) -> list[Finding]:
        """Diagnose's findings: the deadlock first (from the wait-for graph), then desyncs and crossed messages."""
        out = stream_findings(self.states, self.edges, self.starved, self.cycle, self.more_cycles) \
            if self.deadlock else []
        by_instance: dict[tuple, list[dict]] = {}  # (group, seq) -> its members' differing ops, first seen first
        for m in self.mismatches():
            by_instance.setdefault((m["group"], m["seq"]), []).append(m)
        for same in by_instance.values():
            m = same[0]
            kind = "type_mismatch" if any(x["op"].split()[0] != x["first_op"].split()[0] for x in same) \
                else "size_mismatch"
            out.append(Finding(kind, [x["rank"] for x in same], group=m["group"], seq=m["seq"],
                               op=m["first_op"].split()[0],
                               detail=f"`{m['group']}` #{m['seq']}: " + "; ".join(
                                   f"rank {x['rank']} {x['stream']} op {x['op_index']} issues {x['op']} while rank "
                                   f"{x['first_rank']} issues {x['first_op']}" for x in same[:8]) + ".",
                               evidence={"mismatches": same[:100]}))
        for m in self.crossed()[:100]:
            out.append(Finding("crossed_p2p", [m["src"], m["dst"]], op="send",
                               detail=f"rank {m['src']} {m['send']['stream']} op {m['send']['op_index']} sends "
                                      f"`{m['send']['name']}` into rank {m['dst']} {m['recv']['stream']} op "
                                      f"{m['recv']['op_index']}, which expects `{m['recv']['name']}`: ops pair in "
                                      f"posting order, so the receiver gets the wrong tensor.", evidence=m))
        return out

    def mismatches(self) -> list[dict]:
        """Collective instances whose members issue different ops (kind or bytes): a desync, not a hang."""
        rs = self.state
        c = rs.compiled
        out = []
        for g, k, sid, idx, first, first_idx in rs.mismatches:
            r, s = c.streams[sid]
            op = self.program.ranks[r].streams[s][idx]
            r0, s0 = c.streams[first]
            ref = self.program.ranks[r0].streams[s0][first_idx]
            item = {"group": c.group_names[g], "seq": k + 1, "rank": r, "stream": s, "op_index": idx,
                    "op": f"{op.kind} {op.bytes} bytes", "first_rank": r0, "first_op": f"{ref.kind} {ref.bytes} bytes"}
            out.append(item)
        return out

    def crossed(self) -> list[dict]:
        """Sends paired with a receive that names another message: NCCL pairs point-to-point ops in posting
        order, so the receiver gets the wrong tensor (silently when the sizes agree)."""
        c = self.state.compiled
        out = []
        for ss, si, rs_, ri in self.state.crossed:
            (r0, s0), (r1, s1) = c.streams[ss], c.streams[rs_]
            sent, meant = self.program.ranks[r0].streams[s0][si], self.program.ranks[r1].streams[s1][ri]
            out.append({"src": r0, "dst": r1, "send": {"stream": s0, "op_index": si, "name": sent.name},
                        "recv": {"stream": s1, "op_index": ri, "name": meant.name}})
        return out

    def to_json(self) -> dict:
        rs = self.state
        c = rs.compiled
        span = rs.makespan
        cycle = []
        for e in self.cycle:
            item = self._where(self.sid(e.src), rs.pc[self.sid(e.src)])
            # the edge on the cycle first, then the other streams that could also unblock it
            others = [o for o in self.edges[e.src] if o is not e]
            item["waits_for"] = [dict(self._where(self.sid(o.dst), o.dst_op), via=o.resource) for o in [e, *others]]
            cycle.append(item)
        blocked = [self._where(sid, rs.pc[sid]) for sid in rs.blocked_sids()]
        streams = {}
        for sid, (r, s) in enumerate(c.streams):
            busy, wait = rs.busy[sid], rs.wait[sid]
            streams[f"{r}/{s}"] = {"busy_us": round(busy, 3), "wait_us": round(wait, 3),
                                   "idle_us": round(max(span - busy - wait, 0.0), 3)}
        buffers = {f"{r}/{b}": {"capacity": c.capacity[bid], "peak": rs.peak[bid]}
                   for bid, (r, b) in enumerate(c.buffer_keys)}
        return {
            "deadlock": self.deadlock,
            "cycle": cycle,
            "blocked": blocked,
            "makespan_us": round(span, 3),
            "streams": streams,
            "bubble_fraction": round(self.bubble_fraction(), 6),
            "buffers": buffers,
            "explanation": self.explanation(),
            "other_cycles": [[self._where(self.sid(n), rs.pc[self.sid(n)]) for n in cyc]
                             for cyc in self.more_cycles[:100]],
            "other_cycles_count": len(self.more_cycles),
            "mismatches": self.mismatches(),
            "crossed_messages": self.crossed(),
            **({"timing": self.timing.to_json()} if self.timing else {}),
            "ops": sum(len(o) for o in c.ops),
            "ops_executed": rs.ops_executed,
            "findings": findings_json(self.findings()),
        }

    def to_text(self, top: int = 12) -> str:
        rs = self.state
        c = rs.compiled
        ranks = len({r for r, _ in c.streams})
        findings = self.findings()  # the deadlock's and the desyncs', computed once
        out = []
        if self.deadlock:
            blocked = rs.blocked_sids()
            out.append(f"DEADLOCK: {len(blocked)} of {len(c.streams)} streams on "
                       f"{len({c.rank_of[s] for s in blocked})} of {ranks} ranks can never move "
                       f"({self.program.source}, stuck at t={rs.makespan:.1f} us).")
            out.extend(finding_lines([f for f in findings if f.kind not in _DESYNC], "  ", top, blank=False))
            if len(self.more_cycles) > MAX_CYCLE_FINDINGS:
                out.append(f"  {len(self.more_cycles)} cycles disjoint from the first in all (--format json: "
                           f"other_cycles_count).")
            shown = {self.sid(n) for n in [e.src for e in self.cycle] + list(self.starved)
                     + [n for cyc in self.more_cycles for n in cyc]}
            rest = [s for s in blocked if s not in shown]
            if rest:
                out.append(f"  Also blocked, waiting on the above ({len(rest)}):")
                for sid in rest[:top]:
                    w = self._where(sid, rs.pc[sid])
                    out.append(f"    rank {w['rank']} {w['stream']} at op {w['op_index']} ({w['op']})")
                if len(rest) > top:
                    out.append(f"    ... and {len(rest) - top} more (--format json lists all)")
        else:
            out.append(f"No deadlock: all {len(c.streams)} streams on {ranks} ranks finished "
                       f"({self.program.source}).")
        if self.timing is not None:
            out.insert(1, "  " + self.timing.sentence())
        desync = [f for f in findings if f.kind in _DESYNC]
        mism, crossed = self.mismatches(), self.crossed()
        if mism:
            out.append(f"  WARNING: {len(mism)} collective(s) differ across the members of their group (desync):")
        if crossed:
            out.append(f"  WARNING: {len(crossed)} point-to-point message(s) reach a receive meant for another "
                       f"(ops pair in posting order; the receiver gets the wrong tensor):")
        out.extend(finding_lines(desync, "  ", top, blank=False))
        out.append(f"Makespan {rs.makespan:.1f} us; bubble fraction {self.bubble_fraction():.3f} "
                   f"(compute streams idle or waiting); {rs.ops_executed} of {sum(len(o) for o in c.ops)} "
                   f"ops executed.")
        # One row per stream name, averaged over the ranks that have it (per-rank numbers: --format json).
        by_name: dict[str, list[int]] = {}
        for sid, (_, s) in enumerate(c.streams):
            by_name.setdefault(s, []).append(sid)
        out.append("Per stream, mean over the ranks that have it (us; per rank: --format json):")
        out.append(f"  {'stream':<16} {'ranks':>6} {'busy':>11} {'wait':>11} {'idle':>11}   most waiting")
        for s, sids in by_name.items():
            n = len(sids)
            busy = sum(rs.busy[i] for i in sids) / n
            wait = sum(rs.wait[i] for i in sids) / n
            idle = sum(max(rs.makespan - rs.busy[i] - rs.wait[i], 0.0) for i in sids) / n
            worst = max(sids, key=lambda i: (rs.wait[i], -i))
            out.append(f"  {s:<16} {n:>6} {busy:>11.1f} {wait:>11.1f} {idle:>11.1f}   "
                       f"rank {c.rank_of[worst]} ({rs.wait[worst]:.1f})")
        peaks: dict[str, list[tuple[int, int]]] = {}
        for i, (_, b) in enumerate(c.buffer_keys):
            peaks.setdefault(b, []).append((rs.peak[i], c.capacity[i]))
        for b, pc in peaks.items():
            lo, hi = min(p for p, _ in pc), max(p for p, _ in pc)
            clo, chi = min(k for _, k in pc), max(k for _, k in pc)
            span = (lambda a, z: f"{a}" if a == z else f"{a}-{z}")
            out.append(f"Buffer `{b}`: peak occupancy {span(lo, hi)} of {span(clo, chi)} slots over {len(pc)} ranks.")
        return "\n".join(out)


@dataclass
class Timing:
    """Jittered-timing trials run after a nominal run without deadlock."""

    trials: int
    jitter: float
    seed: int
    deadlocked: list[int]  # trial numbers (0-based) that deadlocked; trial k uses seed + k
    desynced: list[int]  # trials that finished but matched different collectives across members
    shown: int | None  # the trial whose result is reported, None for the nominal run
    makespans: list[float] = field(default_factory=list)  # of the trials that finished
    comm: bool = False  # communication times were jittered too

    def spread(self) -> dict | None:
        if not self.makespans:
            return None
        m = sorted(self.makespans)
        return {"min": round(m[0], 3), "median": round(m[len(m) // 2], 3), "max": round(m[-1], 3)}

    def to_json(self) -> dict:
        return {"trials": self.trials, "jitter": self.jitter, "seed": self.seed,
                "deadlocked_trials": len(self.deadlocked), "desynced_trials": len(self.desynced),
                "shown": "nominal" if self.shown is None else f"trial {self.shown} (seed {self.seed + self.shown})",
                **({"makespan_us": self.spread()} if self.makespans else {})}

    def sentence(self) -> str:
        j = f"{'compute and communication' if self.comm else 'compute'} times jittered by up to ±{self.jitter:.0%}"
        if self.shown is None:
            sp = self.spread()
            spread = f"; makespan {sp['min']:.1f}-{sp['max']:.1f} us (median {sp['median']:.1f})" if sp else ""
            return (f"Timing: the nominal run and {self.trials} trials with {j} all finish without deadlock or "
                    f"desync{spread}.")
        return (f"Timing: the nominal timing runs, but {len(self.deadlocked)} deadlock(s) and {len(self.desynced)} "
                f"desync(s) in {self.trials} trials with {j}; shown: trial {self.shown} (seed "
                f"{self.seed + self.shown}).")


def simulate(program: Program, detail: bool = False, trials: int = 0, jitter: float = 0.2,
             seed: int = 0, jitter_comm: bool = False) -> SimResult:
    """Simulate with the program's timing; with `trials`, also with jittered compute times (`jitter_comm`:
    communication times too) when the nominal run finishes, and report the first jittered trial that
    deadlocks (else desyncs): a plan that *can* deadlock under other timings."""
    compiled = compile_program(program)
    result = _analyze(run(compiled, detail=detail))
    if trials <= 0 or result.deadlock:
        return result
    deadlocked, desynced, makespans = [], [], []
    for k in range(trials):
        trial = run(jittered(compiled, jitter, seed + k, jitter_comm), detail=False)
        if trial.deadlock:
            deadlocked.append(k)
        elif trial.mismatches:
            desynced.append(k)
        else:
            makespans.append(trial.makespan)
    shown = deadlocked[0] if deadlocked else desynced[0] if desynced else None
    if shown is not None:
        result = _analyze(run(jittered(compiled, jitter, seed + shown, jitter_comm), detail=detail))
    result.timing = Timing(trials, jitter, seed, deadlocked, desynced, shown, makespans, jitter_comm)
    return result


def _analyze(state) -> SimResult:
    if not state.deadlock:
        return SimResult(state, [], {}, {}, [])
    g = analyze_streams(stream_states(state))
    return SimResult(state, g.cycle, g.edges, g.starved, g.more_cycles, g.states)
