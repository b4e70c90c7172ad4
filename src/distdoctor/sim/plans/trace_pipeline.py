"""`sim from-trace --scale-pp K`: recognise a pipeline in a recorded run and re-derive it at K stages.

A recorded run is a pipeline when its point-to-point traffic joins ranks into chains (each rank talks to at
most two others, no rings), all of the same length P >= 2: stage 0 is the end whose first p2p call to
complete is a send (the first activation; receives may be posted ahead). On stage 0 of the first chain, the
sends to stage 1 are forwards and the receives from it backwards; a step ends when every micro-batch sent has
come back, so the sends of a step are its micro-batches M (messages of the commonest size only: set-up
exchanges are not), and a step in which every send precedes every receive is GPipe (else 1F1B; with M <= P
the two issue the same order on stage 0 and read as GPipe).

At K stages the same model is cut finer: per stage and micro-batch, the forward and backward take the
recorded per-stage compute (the median over the pipeline's ranks of their measured compute, divided by the
micro-batches run) times P / K, split 1 : 2 between forward and backward (the usual ratio: the trace does
not say which gap is which); activations keep their recorded size; the chains are the data-parallel
replicas, whose gradient all-reduce keeps the recorded bytes per step. `plans/pipeline.py` builds the
program (one compute stream per rank running the schedule, receives posted ahead), with the replay's eager
bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import median

from distdoctor.errors import InputError
from distdoctor.sim.ir import Program
from distdoctor.sim.plans.from_trace import UNBOUNDED, Replay
from distdoctor.sim.plans.pipeline import PipelineConfig, build_pipeline


@dataclass
class PipelineShape:
    chains: list[list[int]]  # per replica, its ranks in stage order
    microbatches: int
    steps: int
    schedule: str  # "gpipe" or "1f1b"
    stage_compute_us: float  # per stage and micro-batch, forward and backward together
    act_bytes: int
    grad_bytes: int  # per rank and step, collectives (data-parallel gradients and the rest)


def _chains(replay: Replay) -> list[list[int]] | str:
    peers: dict[int, set[int]] = {}
    first: dict[int, tuple] = {}  # rank -> (when, op) of its first p2p call to complete (receives may be posted early)
    for r, calls in replay.calls_by_rank.items():
        for k, c in enumerate(calls):
            e = c.entry
            if e.is_p2p:
                peers.setdefault(r, set()).add(e.peer)
                peers.setdefault(e.peer, set()).add(r)
                key = (e.t_completed if e.t_completed is not None else float("inf"), k, e.op)
                first[r] = min(first.get(r, key), key)
    if not peers:
        return "it has no point-to-point traffic"
    busy = sorted(r for r, p in peers.items() if len(p) > 2)
    if busy:
        return f"rank {busy[0]} exchanges messages with {len(peers[busy[0]])} ranks (a stage has two neighbours)"
    chains, seen = [], set()
    for end in sorted(r for r, p in peers.items() if len(p) == 1):
        if end in seen:
            continue
        chain, prev = [end], None
        while True:
            nxt = [p for p in peers[chain[-1]] if p != prev]
            if not nxt:
                break
            prev = chain[-1]
            chain.append(nxt[0])
        seen.update(chain)
        if first[chain[0]][2] != "send":
            chain.reverse()
        chains.append(chain)
    if seen != set(peers):
        ring = sorted(set(peers) - seen)
        return f"ranks {ring} pass messages around a ring, not along a chain of stages"
    if len({len(c) for c in chains}) > 1:
        return f"its chains of stages differ in length ({sorted({len(c) for c in chains})})"
    return chains


def detect(replay: Replay) -> PipelineShape | str:
    """The pipeline the run is, or why it is not one (a sentence to follow "not a pipeline: ")."""
    chains = _chains(replay)
    if isinstance(chains, str):
        return chains
    s0, s1 = chains[0][0], chains[0][1]
    flow = [c for c in replay.calls_by_rank[s0] if c.entry.is_p2p and c.entry.peer == s1]
    # set-up exchanges (torch's pipelining trades shapes first) are not micro-batches: keep the commonest size
    sizes = Counter(c.nbytes for c in flow if c.entry.op == "send")
    if sizes:
        act = sizes.most_common(1)[0][0]
        flow = [c for c in flow if c.nbytes == act]
    # in time: an activation leaves when its send is issued, a gradient is back when its receive completes
    # (receives may be posted ahead, from another thread)
    flow.sort(key=lambda c: (c.entry.t_created if c.entry.op == "send" else c.entry.t_completed) or 0.0)
    steps, sends, inflight, peak, order_ok, per_step = 0, 0, 0, 0, True, []
    received = False
    for c in flow:
        if c.entry.op == "send":
            if received and inflight:
                order_ok = False  # a forward after a backward within the step: 1F1B
            sends += 1
            inflight += 1
            peak = max(peak, inflight)
        else:
            received = True
            inflight -= 1
            if inflight <= 0:
                steps += 1
                per_step.append(sends)
                sends, inflight, received = 0, 0, False
    if sends:
        per_step.append(sends)
        steps += 1
    if not per_step or max(per_step) == 0:
        return f"stage 0 (rank {s0}) never sends to stage 1 (rank {s1})"
    m = max(per_step)
    ranks = [r for chain in chains for r in chain]
    compute = []
    for r in ranks:
        stream_ops = replay.program.ranks[r].streams
        compute.append(sum(op.us for name, ops in stream_ops.items() if name.startswith("host ")
                           for op in ops if op.op == "compute"))
    per_mb = median(compute) / (m * steps)
    acts = [c.nbytes for c in flow if c.entry.op == "send"]
    colls = [sum(c.nbytes for c in replay.calls_by_rank[r] if not c.entry.is_p2p) for r in ranks]
    return PipelineShape(chains, m, steps, "gpipe" if order_ok and peak == m else "1f1b", per_mb,
                         max(acts) if acts else 0, int(median(colls) / steps) if colls else 0)


@dataclass
class Rescaled:
    shape: PipelineShape
    stages: int
    program: Program
    recorded_us: float | None = None  # the recorded run's makespan

    def info(self, simulated_us: float) -> dict:
        s = self.shape
        return {"recorded_stages": len(s.chains[0]), "stages": self.stages, "replicas": len(s.chains),
                "microbatches": s.microbatches, "steps": s.steps, "schedule": s.schedule,
                "stage_compute_us": round(s.stage_compute_us * len(s.chains[0]) / self.stages, 3),
                "act_bytes": s.act_bytes, "simulated_makespan_us": round(simulated_us, 3)}

    def sentence(self, simulated_us: float, deadlock: bool = False) -> str:
        s, p = self.shape, len(self.shape.chains[0])
        per = s.stage_compute_us * p / self.stages
        end = f"deadlocks at {simulated_us:.1f} us" if deadlock else f"takes {simulated_us:.1f} us"
        if self.recorded_us:
            end += f" (the recorded run: {self.recorded_us:.1f} us)"
        return (f"Pipeline: the recorded run is {len(s.chains)} replica(s) of a {p}-stage {s.schedule} pipeline "
                f"(ranks {', '.join('-'.join(map(str, c)) for c in s.chains)}), {s.microbatches} micro-batches x "
                f"{s.steps} step(s); re-derived at {self.stages} stages ({per:.1f} us of compute per stage and "
                f"micro-batch) it {end}.")


def rescale(replay: Replay, stages: int, eager_bytes: int | None) -> Rescaled:
    shape = detect(replay)
    if isinstance(shape, str):
        raise InputError("--scale-pp", f"the recorded run is not a pipeline: {shape}")
    per = shape.stage_compute_us * len(shape.chains[0]) / stages
    cfg = PipelineConfig(stages=stages, microbatches=shape.microbatches, schedule=shape.schedule,
                         dp=len(shape.chains), fwd_us=per / 3, bwd_us=2 * per / 3, streams=1, steps=shape.steps,
                         act_bytes=shape.act_bytes, grad_bytes=shape.grad_bytes)
    cfg.check()
    prog = build_pipeline(cfg)
    prog.eager_bytes = UNBOUNDED if eager_bytes is None else eager_bytes
    prog.source = f"{replay.source} at {stages} pipeline stages"
    return Rescaled(shape, stages, prog, replay.recorded_makespan_us)
