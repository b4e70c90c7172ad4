"""Run a program and turn the engine's state into the report: the JSON contract and the text verdict.

JSON (`distdoctor sim run FILE --format json`):
    {"deadlock", "cycle": [{"rank", "stream", "op_index", "op", "waits_for": [...]}],
     "blocked": [{"rank", "stream", "op_index", "op"}], "makespan_us",
     "streams": {"<rank>/<stream>": {"busy_us", "wait_us", "idle_us"}}, "bubble_fraction",
     "buffers": {"<rank>/<buffer>": {"capacity", "peak"}}, "explanation": [...], "ops", "ops_executed"}
`bubble_fraction` is the mean over ranks (that have compute) of the fraction of the makespan during which
none of their compute streams (streams with at least one `compute` op) is busy: idle or waiting.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.sim.engine import RunState, compile_program, run
from distdoctor.sim.ir import Program, label
from distdoctor.sim.waitfor import Edge, build_edges, cycle_sentence, find_cycle, starvation_sentence


@dataclass
class SimResult:
    state: RunState
    cycle: list[Edge]
    edges: dict[int, list[Edge]]
    starved: dict[int, str]

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
            lines.append(cycle_sentence(self.state, self.cycle))
        for sid, reason in sorted(self.starved.items()):
            lines.append(starvation_sentence(self.state, sid, reason))
        return lines

    def to_json(self) -> dict:
        rs = self.state
        c = rs.compiled
        span = rs.makespan
        cycle = []
        for e in self.cycle:
            item = self._where(e.src, rs.pc[e.src])
            # the edge on the cycle first, then the other streams that could also unblock it
            others = [o for o in self.edges[e.src] if o is not e]
            item["waits_for"] = [dict(self._where(o.dst, o.dst_op), via=o.resource) for o in [e, *others]]
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
            "ops": sum(len(o) for o in c.ops),
            "ops_executed": rs.ops_executed,
        }

    def to_text(self, top: int = 12) -> str:
        rs = self.state
        c = rs.compiled
        ranks = len({r for r, _ in c.streams})
        out = []
        if self.deadlock:
            blocked = rs.blocked_sids()
            out.append(f"DEADLOCK: {len(blocked)} of {len(c.streams)} streams on "
                       f"{len({c.rank_of[s] for s in blocked})} of {ranks} ranks can never move "
                       f"({self.program.source}, stuck at t={rs.makespan:.1f} us).")
            for line in self.explanation():
                out.append("  " + line)
            shown = {e.src for e in self.cycle} | set(self.starved)
            rest = [s for s in blocked if s not in shown]
            if rest:
                out.append(f"  Also blocked behind it ({len(rest)}):")
                for sid in rest[:top]:
                    w = self._where(sid, rs.pc[sid])
                    out.append(f"    rank {w['rank']} {w['stream']} at op {w['op_index']} ({w['op']})")
                if len(rest) > top:
                    out.append(f"    ... and {len(rest) - top} more (--format json lists all)")
        else:
            out.append(f"No deadlock: all {len(c.streams)} streams on {ranks} ranks finished "
                       f"({self.program.source}).")
        out.append(f"Makespan {rs.makespan:.1f} us; bubble fraction {self.bubble_fraction():.3f} "
                   f"(compute streams idle or waiting); {rs.ops_executed} of {sum(len(o) for o in c.ops)} "
                   f"ops executed.")
        order = sorted(range(len(c.streams)), key=lambda s: (-rs.wait[s], s))
        out.append(f"Most waiting streams (of {len(c.streams)}):")
        out.append(f"  {'rank/stream':<24} {'busy_us':>12} {'wait_us':>12} {'idle_us':>12}")
        for sid in order[:top]:
            r, s = c.streams[sid]
            idle = max(rs.makespan - rs.busy[sid] - rs.wait[sid], 0.0)
            out.append(f"  {f'{r}/{s}':<24} {rs.busy[sid]:>12.1f} {rs.wait[sid]:>12.1f} {idle:>12.1f}")
        peaks = [(f"{r}/{b}", rs.peak[i], c.capacity[i]) for i, (r, b) in enumerate(c.buffer_keys)]
        if peaks and len(peaks) <= top:
            out.append("Buffer peak occupancy: " + ", ".join(f"{k} {p}/{cap}" for k, p, cap in peaks))
        return "\n".join(out)


def simulate(program: Program, detail: bool = False) -> SimResult:
    state = run(compile_program(program), detail=detail)
    if state.deadlock:
        edges, starved = build_edges(state)
        cycle = find_cycle(edges)
    else:
        edges, starved, cycle = {}, {}, []
    return SimResult(state, cycle, edges, starved)
