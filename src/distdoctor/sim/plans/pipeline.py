"""Pipeline-parallel training steps (GPipe, 1F1B, interleaved 1F1B) x data parallel x tensor parallel, as IR.

Layout (Megatron order): rank = stage * (D * T) + dp_rank * T + tp_rank. Tensor-parallel groups
`tp_s{stage}_d{dp}` hold the T ranks of one stage replica; data-parallel groups `dp_s{stage}_t{tp}` hold the
D replicas of one shard. Stage s of replica d sends activations to stage s+1 of the same replica (same tp
rank) with tag `act`, and gradients back with tag `grad`.

Per micro-batch and model chunk, on each rank:
  F: acquire `act` -> get input (stage > 0) -> compute fwd -> tp all_reduce (T > 1) -> send act (not last)
  B: get grad (not last) -> compute bwd -> tp all_reduce (T > 1) -> send grad (stage > 0) -> release `act`
After the last micro-batch of a step (gradient accumulation over M micro-batches): the dp all_reduce of the
gradients (D > 1); the next step's forward waits for it (the optimizer step).

Streams:
- `--streams 2`: `fwd` and `bwd` compute streams, receives inline on the stream that consumes them (the
  separate-stream design of graph compilers such as OneFlow's). The backward waits for event `fwd_done{mb}`.
  The op that receives the gradient into the backward's input (the "backward-feeding buffer op") goes on
  `bwd`, or on `fwd` at its place in the schedule order with `grad_recv_stream="fwd"` — the misplacement of
  the OneFlow/LiBai 3-D parallel incident, which deadlocks with a one-slot `act` buffer.
- `--streams 1`: one `compute` stream runs the schedule order; receives are posted ahead on `recv_act` /
  `recv_grad` streams (like irecv) that record `act_in*` / `grad_in*` events the compute stream waits on.
The `act` buffer (activations kept for backward) defaults to what the schedule needs: M*V for GPipe, P-s
for 1F1B, Megatron's warm-up + 1 for interleaved; `--act-buffer K` forces K slots on every stage.
Schedules follow Megatron-LM: 1F1B warm-up min(P-s-1, M); interleaved warm-up (P-s-1)*2 + (V-1)*P with
micro-batches taken in groups of P (needs M % P == 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.errors import InputError
from distdoctor.sim.ir import Cost, Op, Program, RankProgram

SCHEDULES = ("gpipe", "1f1b", "interleaved")
MAX_OPS = 60_000_000  # about 10 GB of IR; a 4096-rank, 32-micro-batch plan has 1.5 million


@dataclass(frozen=True)
class PipelineConfig:
    stages: int = 4
    microbatches: int = 8
    schedule: str = "1f1b"
    chunks: int = 1
    dp: int = 1
    tp: int = 1
    fwd_us: float = 1000.0
    bwd_us: float = 2000.0
    act_buffer: int | None = None
    streams: int = 2
    steps: int = 1
    act_bytes: int = 8 << 20
    grad_bytes: int = 256 << 20
    grad_recv_stream: str = "bwd"
    zero_comm: bool = False
    alpha_us: float = 5.0
    gbps: float = 100.0

    def check(self) -> None:
        def bad(flag: str, why: str):
            raise InputError(flag, why)
        for flag, v in (("--stages", self.stages), ("--microbatches", self.microbatches), ("--dp", self.dp),
                        ("--tp", self.tp), ("--chunks", self.chunks), ("--steps", self.steps)):
            if v < 1:
                bad(flag, f"must be at least 1 (got {v})")
        if self.schedule not in SCHEDULES:
            bad("--schedule", f"unknown schedule {self.schedule!r} (expected one of: {', '.join(SCHEDULES)})")
        if self.schedule != "interleaved" and self.chunks != 1:
            bad("--chunks", f"only the interleaved schedule has several model chunks (got {self.chunks})")
        if self.schedule == "interleaved" and self.stages < 2:
            bad("--stages", "the interleaved schedule needs at least 2 stages")
        if self.schedule == "interleaved" and self.microbatches % self.stages:
            bad("--microbatches", f"the interleaved schedule takes micro-batches in groups of --stages: "
                                  f"{self.microbatches} is not a multiple of {self.stages}")
        if self.fwd_us < 0 or self.bwd_us < 0:
            bad("--fwd-us/--bwd-us", "durations must not be negative")
        if self.act_buffer is not None and self.act_buffer < 1:
            bad("--act-buffer", f"must be at least 1 slot (got {self.act_buffer})")
        if self.streams not in (1, 2):
            bad("--streams", f"must be 1 or 2 (got {self.streams})")
        if self.grad_recv_stream not in ("fwd", "bwd"):
            bad("--grad-recv-stream", f"must be fwd or bwd (got {self.grad_recv_stream!r})")
        if self.streams == 1 and self.grad_recv_stream == "fwd":
            bad("--grad-recv-stream", "only meaningful with --streams 2")
        if self.alpha_us < 0 or self.gbps <= 0:
            bad("--alpha-us/--gbps", "alpha must not be negative and bandwidth must be positive")
        ops = self.world * self.microbatches * self.chunks * self.steps * 12
        if ops > MAX_OPS:
            bad("plan", f"about {ops:,} ops is more than this simulator holds in memory ({MAX_OPS:,}); "
                        f"simulate fewer data-parallel replicas (they behave alike) or fewer micro-batches")

    @property
    def world(self) -> int:
        return self.stages * self.dp * self.tp


def schedule_order(cfg: PipelineConfig, stage: int) -> list[tuple[str, int, int]]:
    """One step's compute order on a stage: ("F"|"B", micro-batch, chunk)."""
    P, M, V = cfg.stages, cfg.microbatches, cfg.chunks
    if cfg.schedule == "gpipe":
        return [("F", m, 0) for m in range(M)] + [("B", m, 0) for m in range(M)]
    total = M * V

    def item(kind: str, k: int) -> tuple[str, int, int]:
        group, within = divmod(k, P * V)
        chunk = within // P
        return kind, group * P + within % P, (chunk if kind == "F" else V - 1 - chunk)

    if cfg.schedule == "1f1b":
        warmup = min(P - stage - 1, total)
    else:
        warmup = min((P - stage - 1) * 2 + (V - 1) * P, total)
    order = [item("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        order.append(item("F", warmup + i))
        order.append(item("B", i))
    order.extend(item("B", k) for k in range(total - warmup, total))
    return order


def default_act_slots(cfg: PipelineConfig, stage: int) -> int:
    if cfg.act_buffer is not None:
        return cfg.act_buffer
    order = schedule_order(cfg, stage)
    live = peak = 0
    for kind, _, _ in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def build_pipeline(cfg: PipelineConfig) -> Program:
    cfg.check()
    from distdoctor.trace.loaders import gc_paused  # see engine.compile_program

    with gc_paused():
        return _build(cfg)


def _build(cfg: PipelineConfig) -> Program:
    P, D, T = cfg.stages, cfg.dp, cfg.tp
    comm_us = 0.0 if cfg.zero_comm else None
    groups: dict[str, list[int]] = {}

    def rank_of(s: int, d: int, t: int) -> int:
        return s * (D * T) + d * T + t

    if T > 1:
        for s in range(P):
            for d in range(D):
                groups[f"tp_s{s}_d{d}"] = [rank_of(s, d, t) for t in range(T)]
    if D > 1:
        for s in range(P):
            for t in range(T):
                groups[f"dp_s{s}_t{t}"] = [rank_of(s, d, t) for d in range(D)]
    ranks: dict[int, RankProgram] = {}
    _new, DT, act_bytes = tuple.__new__, D * T, cfg.act_bytes
    assert Op._fields[5:8] == ("bytes", "peer", "tag") and len(Op._fields) == 11
    for s in range(P):
        template = _stage_template(cfg, s)
        slots = default_act_slots(cfg, s)
        dp_ops: dict[tuple[int, str], Op] = {}  # one Op per dp group, shared by its members
        for d in range(D):
            tp_ops: dict[str, Op] = {}  # one Op per tp group, shared by its members
            for t in range(T):
                dt = rank_of(0, d, t)
                streams: dict[str, list[Op]] = {}
                for st, items in template.items():
                    out = []
                    for x in items:
                        if type(x) is Op:
                            out.append(x)
                        elif x[0] == "tp":
                            op = tp_ops.get(x[1])
                            if op is None:
                                op = tp_ops[x[1]] = Op("collective", x[1], comm_us, group=f"tp_s{s}_d{d}",
                                                       kind="all_reduce", bytes=x[2])
                            out.append(op)
                        elif x[0] == "dp":
                            op = dp_ops.get((t, x[1]))
                            if op is None:
                                op = dp_ops[(t, x[1])] = Op("collective", x[1], comm_us, group=f"dp_s{s}_t{t}",
                                                            kind="all_reduce", bytes=x[2])
                            out.append(op)
                        else:  # ("send"|"recv", name, peer stage, tag): Op(x[0], x[1], comm_us, bytes=...,
                            # peer=..., tag=x[3]) built positionally, which is 3x faster for millions of them
                            out.append(_new(Op, (x[0], x[1], comm_us, "", "", act_bytes, x[2] * DT + dt, x[3],
                                                 "", "", None)))
                    if out:
                        streams[st] = out
                ranks[rank_of(s, d, t)] = RankProgram(buffers={"act": slots}, streams=streams)
    name = f"pipeline-{cfg.schedule}-P{P}xD{D}xT{T}-M{cfg.microbatches}"
    return Program(groups=groups, ranks=dict(sorted(ranks.items())), cost=Cost(cfg.alpha_us, cfg.gbps),
                   source=name)


def _stage_template(cfg: PipelineConfig, s: int) -> dict[str, list]:
    """One stage's streams, identical on all its ranks except the markers resolved per rank:
    ("tp", name, bytes) / ("dp", name, bytes) collectives and ("send"|"recv", name, peer stage, tag)."""
    P, V, M, T, D = cfg.stages, cfg.chunks, cfg.microbatches, cfg.tp, cfg.dp
    VS = P * V
    two = cfg.streams == 2
    F_STREAM, B_STREAM = ("fwd", "bwd") if two else ("compute", "compute")
    streams: dict[str, list] = {F_STREAM: [], B_STREAM: []}
    if not two:
        streams["recv_act"], streams["recv_grad"] = [], []
    fwd, bwd = streams[F_STREAM], streams[B_STREAM]
    grad_feed = streams[cfg.grad_recv_stream] if two else None
    acquire, release = Op("acquire", buffer="act"), Op("release", buffer="act")
    order = schedule_order(cfg, s)
    for step in range(cfg.steps):
        if step and two:
            fwd.append(Op("wait", event=f"step_done{step - 1}"))
        for kind, mb, c in order:
            m = step * M + mb
            vs = c * P + s
            tag = f"{m}" if V == 1 else f"{m}_c{c}"
            # a message is named after its sender's chunk on both ends (the ring wraps to the next chunk)
            tag_prev = f"{m}" if V == 1 else f"{m}_c{(vs - 1) // P}"
            tag_next = f"{m}" if V == 1 else f"{m}_c{(vs + 1) // P}"
            if kind == "F":
                fwd.append(acquire)
                if vs > 0:
                    recv = ("recv", f"act_mb{tag_prev}", (vs - 1) % P, "act")
                    if two:
                        fwd.append(recv)
                    else:
                        streams["recv_act"] += [recv, Op("record", event=f"act_in{tag}")]
                        fwd.append(Op("wait", event=f"act_in{tag}"))
                fwd.append(Op("compute", f"fwd_mb{tag}", cfg.fwd_us))
                if T > 1:
                    fwd.append(("tp", f"tp_fwd_mb{tag}", cfg.act_bytes))
                if vs < VS - 1:
                    fwd.append(("send", f"act_mb{tag}", (vs + 1) % P, "act"))
                if two:
                    fwd.append(Op("record", event=f"fwd_done{tag}"))
                continue
            if vs < VS - 1:
                recv = ("recv", f"grad_mb{tag_next}", (vs + 1) % P, "grad")
                if not two:
                    streams["recv_grad"] += [recv, Op("record", event=f"grad_in{tag}")]
                    bwd.append(Op("wait", event=f"grad_in{tag}"))
                elif grad_feed is bwd:
                    bwd.append(recv)
                else:  # misplaced on the forward stream: bwd waits for it through an event
                    grad_feed += [recv, Op("record", event=f"grad_in{tag}")]
                    bwd.append(Op("wait", event=f"grad_in{tag}"))
            if two:
                bwd.append(Op("wait", event=f"fwd_done{tag}"))
            bwd.append(Op("compute", f"bwd_mb{tag}", cfg.bwd_us))
            if T > 1:
                bwd.append(("tp", f"tp_bwd_mb{tag}", cfg.act_bytes))
            if vs > 0:
                bwd.append(("send", f"grad_mb{tag}", (vs - 1) % P, "grad"))
            bwd.append(release)
        if D > 1:
            bwd.append(("dp", f"dp_grads_step{step}", cfg.grad_bytes))
        if two and step + 1 < cfg.steps:
            bwd.append(Op("record", event=f"step_done{step}"))
    return streams
