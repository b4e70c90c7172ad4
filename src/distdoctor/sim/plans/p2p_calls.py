"""Pipeline steps as the host drives them in Megatron-LM: compute and point-to-point *calls* on one stream.

`distdoctor sim pipeline --p2p-order ...` builds this instead of the stream-per-direction plans of
pipeline.py. Per rank, the `main` stream runs the schedule (pipeline.schedule_order) the way Megatron-LM's
`forward_backward_pipelining_*` functions issue it; between computes come p2p *calls*, each with up to four
ops: send_prev (a gradient to the previous stage), recv_prev (an activation from it), send_next (an
activation to the next stage), recv_next (a gradient from it). Which call comes where:
- 1F1B (one chunk): recv_forward, F, send_forward in the warm-up; F, send_forward_recv_backward, B,
  send_backward_recv_forward in the steady state; recv_backward, B, send_backward in the cool-down;
- interleaved: recv_forward first; after each warm-up F one send_forward_recv_forward (the last one also
  receives the first gradient); after each steady F and B one send_forward_backward_recv_forward_backward;
  after each cool-down B one send_backward_recv_backward. "Next"/"prev" wrap around the ring of ranks.
A call receives ahead: the input of the next forward and the gradient of the next backward.

How a call's ops run (`p2p_order`):
- `send-first`: in Megatron-LM's batched order [send_prev, recv_prev, send_next, recv_next] (the order of
  `_batched_p2p_ops` and `_communicate_shapes`), each op completing before the next starts, as blocking
  p2p does;
- `recv-first`: [recv_prev, recv_next, send_prev, send_next], each blocking;
- `parity`: Megatron-LM's `_p2p_ops` order: even ranks [send_next, recv_prev, send_prev, recv_next], odd
  ranks [recv_prev, send_next, recv_next, send_prev], each blocking;
- `batched`: all ops of a call progress together (an NCCL group, `batch_isend_irecv`): the sends to a peer
  and the receives from it each on a helper stream (`send_next`, `recv_prev`, ...) in the call's posting
  order [send_prev, recv_prev, send_next, recv_next] (`_batched_p2p_ops`); the main stream continues when
  the whole call is done. At P = 2 prev and next are one peer, so its two sends and two receives pair in
  that order: the activation and the gradient cross (Megatron-LM PR #5271), which the report flags.
All p2p between two ranks shares one channel (NCCL p2p is tagless), so messages pair in posting order.
`eager_bytes` lets a channel buffer sends that complete before their receive (NCCL's connection buffers).

Communicators (`comm_init`; without it they exist before the step): every rank creates each communicator it
uses with a `comm_init` op, a collective over the communicator's members (ncclCommInitRank blocks until all
of them call it). Unbatched p2p on a group of more than two ranks uses a 2-rank communicator per pair of
ranks (ProcessGroupNCCL); batched calls use the pipeline group's own communicator (`pp`, all ranks).
- `eager`: before the step, every rank creates its communicators in one global order (by ranks);
- `lazy`: a rank creates a communicator at its first op on it (ProcessGroupNCCL's lazy initialization), in
  the order its calls reach its peers;
- `neighbors`: before the step, each rank creates its pair communicators relative to itself, next stage
  first: under an interleaved schedule the ranks form a ring and the creations wait on each other around it.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.errors import InputError
from distdoctor.sim.ir import Cost, Op, Program, RankProgram
from distdoctor.sim.plans.pipeline import PipelineConfig, schedule_order

P2P_ORDERS = ("send-first", "recv-first", "parity", "batched")
COMM_INIT = ("eager", "lazy", "neighbors")
_DIRS = ("send_prev", "recv_prev", "send_next", "recv_next")
_ORDER = {
    "send-first": (("send_prev", "recv_prev", "send_next", "recv_next"),) * 2,
    "recv-first": (("recv_prev", "recv_next", "send_prev", "send_next"),) * 2,
    "parity": (("send_next", "recv_prev", "send_prev", "recv_next"),
               ("recv_prev", "send_next", "recv_next", "send_prev")),
}


@dataclass(frozen=True)
class CallsConfig:
    p2p_order: str = "batched"
    comm_init: str | None = None  # None: communicators exist before the step
    eager_bytes: int = 0

    def check(self, streams_given: bool, tp: int, dp: int) -> None:
        if self.p2p_order not in P2P_ORDERS:
            raise InputError("--p2p-order", f"unknown order {self.p2p_order!r} (expected one of: "
                                            f"{', '.join(P2P_ORDERS)})")
        if self.comm_init is not None and self.comm_init not in COMM_INIT:
            raise InputError("--comm-init", f"must be one of {', '.join(COMM_INIT)} (got {self.comm_init!r})")
        if self.eager_bytes < 0:
            raise InputError("--eager-bytes", f"must not be negative (got {self.eager_bytes})")
        if streams_given:
            raise InputError("--streams", "--p2p-order runs compute and p2p calls on one host-driven stream; "
                                          "drop --streams")
        if tp != 1 or dp != 1:
            raise InputError("--p2p-order", "models the pipeline ranks only: use --tp 1 --dp 1")


def _calls(cfg: PipelineConfig, stage: int) -> list[tuple]:
    """The stage's sequence: ("F"|"B", mb, chunk) computes and ("call", {dir: (mb, chunk)}) p2p calls."""
    P, V = cfg.stages, cfg.chunks
    VS = P * V
    order = schedule_order(cfg, stage)
    fwds = [x for x in order if x[0] == "F"]
    bwds = [x for x in order if x[0] == "B"]
    nf = nb = 0  # next forward / backward whose input is not received yet
    out: list[tuple] = []

    def need_in(x) -> bool:  # its input comes from another virtual stage
        vs = x[2] * P + stage
        return vs > 0 if x[0] == "F" else vs < VS - 1

    def call(send_f=None, send_b=None, recv_f=False, recv_b=False) -> None:
        nonlocal nf, nb
        ops = {}
        if send_f is not None and send_f[2] * P + stage < VS - 1:
            ops["send_next"] = send_f
        if send_b is not None and send_b[2] * P + stage > 0:
            ops["send_prev"] = send_b
        if recv_f and nf < len(fwds):
            if need_in(fwds[nf]):
                ops["recv_prev"] = fwds[nf]
            nf += 1
        if recv_b and nb < len(bwds):
            if need_in(bwds[nb]):
                ops["recv_next"] = bwds[nb]
            nb += 1
        if ops:
            out.append(("call", ops))

    lead = next((i for i, x in enumerate(order) if x[0] == "B"), len(order))  # forwards before the first B
    warm = lead if lead == len(fwds) else lead - 1  # warm-up forwards; then (F, B) pairs, then the cool-down
    steady = [(order[i], order[i + 1]) for i in range(warm, warm + 2 * (len(fwds) - warm), 2)]
    cool = order[warm + 2 * len(steady):]
    if V == 1:
        for f in order[:warm]:
            call(recv_f=True)
            out.append(f)
            call(send_f=f)
        if steady:
            call(recv_f=True)
        for i, (f, b) in enumerate(steady):
            out.append(f)
            call(send_f=f, recv_b=True)
            out.append(b)
            call(send_b=b, recv_f=i + 1 < len(steady))
        for b in cool:
            call(recv_b=True)
            out.append(b)
            call(send_b=b)
        return out
    call(recv_f=True)
    for k, f in enumerate(order[:warm]):
        out.append(f)
        call(send_f=f, recv_f=True, recv_b=k == warm - 1)
    for f, b in steady:
        out.append(f)
        out.append(b)
        call(send_f=f, send_b=b, recv_f=True, recv_b=True)
    for b in cool:
        out.append(b)
        call(send_b=b, recv_b=True)
    return out


def _message(cfg: PipelineConfig, stage: int, direction: str, item) -> tuple[int, str]:
    """(peer rank, message name) of one op; both ends name a message after its sender's virtual stage."""
    P = cfg.stages
    _, mb, c = item
    vs = c * P + stage
    if direction in ("send_next", "recv_prev"):
        src_vs = vs if direction == "send_next" else vs - 1
        kind = "act"
    else:
        src_vs = vs if direction == "send_prev" else vs + 1
        kind = "grad"
    peer = (stage + 1) % P if direction.endswith("next") else (stage - 1) % P
    dst_vs = src_vs + 1 if kind == "act" else src_vs - 1
    return peer, f"{kind} vs{src_vs}->vs{dst_vs} mb{mb}"


def build_calls(cfg: PipelineConfig, calls: CallsConfig) -> Program:
    """The host-driven program for a PipelineConfig `cfg` (tp = dp = 1) and the call model `calls`."""
    P = cfg.stages
    comm_us = 0.0 if cfg.zero_comm else None
    batched = calls.p2p_order == "batched"
    sequences = {s: _calls(cfg, s) for s in range(P)}
    peers = {s: [] for s in range(P)}  # each rank's peers, in the order its calls first reach them
    for s, seq in sequences.items():
        for x in seq:
            for d in (_ORDER.get(calls.p2p_order, (_DIRS,) * 2)[s % 2] if x[0] == "call" else ()):
                peer = _message(cfg, s, d, x[1][d])[0] if d in x[1] else None
                if peer is not None and peer not in peers[s]:
                    peers[s].append(peer)
    groups: dict[str, list[int]] = {}
    if batched and calls.comm_init:
        groups["pp"] = list(range(P))
    elif calls.comm_init:
        for s in range(P):
            for peer in peers[s]:
                groups[_pair(s, peer)] = sorted((s, peer))
        groups = dict(sorted(groups.items(), key=lambda kv: kv[1]))
    ranks: dict[int, RankProgram] = {}
    for s in range(P):
        order = _ORDER.get(calls.p2p_order, (_DIRS,) * 2)[s % 2]
        main: list[Op] = []
        helpers: dict[str, list[Op]] = {}
        created: set[str] = set()
        if batched and calls.comm_init in ("eager", "neighbors"):
            created.add("pp")
            main.append(Op("comm_init", group="pp", kind="comm_init"))
        elif calls.comm_init in ("eager", "neighbors"):
            # eager: every rank in one global order; neighbors: relative to the rank, next stage first
            first = sorted(peers[s], key=lambda p: sorted((s, p))) if calls.comm_init == "eager" else \
                sorted(peers[s], key=lambda p: (p != (s + 1) % P, p))
            for peer in first:
                created.add(_pair(s, peer))
                main.append(Op("comm_init", group=_pair(s, peer), kind="comm_init"))

        for n, x in enumerate(sequences[s]):
            if x[0] == "F" or x[0] == "B":
                _, mb, c = x
                tag = f"{mb}" if cfg.chunks == 1 else f"{mb}_c{c}"
                us = cfg.fwd_us if x[0] == "F" else cfg.bwd_us
                main.append(Op("compute", f"{'fwd' if x[0] == 'F' else 'bwd'}_mb{tag}", us))
                continue
            ops = x[1]
            if batched:
                if calls.comm_init == "lazy" and "pp" not in created:  # the group's communicator, all ranks
                    created.add("pp")
                    main.append(Op("comm_init", group="pp", kind="comm_init"))
                main.append(Op("record", event=f"call{n}"))
            for d in order:
                if d not in ops:
                    continue
                peer, name = _message(cfg, s, d, ops[d])
                op = Op("send" if d.startswith("send") else "recv", name, comm_us, bytes=cfg.act_bytes, peer=peer)
                if not batched:
                    if calls.comm_init == "lazy" and _pair(s, peer) not in created:  # the pair's, on first use
                        created.add(_pair(s, peer))
                        main.append(Op("comm_init", group=_pair(s, peer), kind="comm_init"))
                    main.append(op)
                    continue
                # ops to one peer pair in posting order (NCCL is tagless): at P = 2 prev is next
                lane = f"{op.op}_{'next' if peer == (s + 1) % P else 'prev'}"
                helpers.setdefault(lane, []).extend(
                    [Op("wait", event=f"call{n}"), op, Op("record", event=f"call{n}_{d}")])
            if batched:
                main += [Op("wait", event=f"call{n}_{d}") for d in _DIRS if d in ops]
        ranks[s] = RankProgram(streams={"main": main, **{k: helpers[k] for k in sorted(helpers)}})
    name = (f"pipeline-{cfg.schedule}-P{P}-M{cfg.microbatches}-{calls.p2p_order}"
            f"{'-' + calls.comm_init + '-init' if calls.comm_init else ''}")
    return Program(groups=groups, ranks=ranks, cost=Cost(cfg.alpha_us, cfg.gbps), source=name,
                   eager_bytes=calls.eager_bytes)


def _pair(a: int, b: int) -> str:
    return f"pp_{min(a, b)}_{max(a, b)}"
