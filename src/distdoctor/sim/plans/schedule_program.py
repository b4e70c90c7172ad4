"""A checked per-rank action list (torch.distributed.pipelining's form, with sends and receives) as a program.

What torch's `_PipelineScheduleRuntime._step_microbatches` does with each action, on a GPU, as streams:
- F / B / I / W run on the rank's `compute` stream in list order (the sub-actions of OVERLAP_F_B one after
  the other); after each, the compute stream records an event;
- SEND_* / RECV_* are one op each; how they run is `comm_model`:
  - "nccl" (torch 2.13's runtime on NCCL): `_batch_p2p` issues a lone send or receive as a plain isend/irecv,
    which ProcessGroupNCCL runs on the 2-rank communicator of the pair, one NCCL stream per peer: a stream
    `p2p_next` / `p2p_prev` / `p2p_r<peer>` per peer runs its ops in list order, each a rendezvous with the
    peer's (NCCL pairs point-to-point ops in posting order), each first waiting for the compute issued before
    it on the CPU (ProcessGroupNCCL makes its stream wait for the current stream when an op is posted);
  - "coalesced": the same on one `p2p` stream per rank (ops coalesced on the group's communicator, as
    batch_isend_irecv does) — a receive posted early also holds back sends to other peers;
  - "ideal": per peer a `send_*` stream whose sends wait only for the compute that produced their tensor and a
    `recv_*` stream posting receives ahead: no false waits, the bound the analytic bubble formulas assume;
  with `eager_bytes` a send that fits the peer channel's buffer completes before its receive (small messages
  on NCCL); without, every send is a rendezvous (messages larger than NCCL's buffers, the worst case);
- before a compute that consumes a received tensor the runtime waits on that receive (`_wait_batch_p2p`):
  the compute stream waits for the event recorded after it; sends are waited only at the end of the step;
- an input from a stage on the same rank (V-shaped schedules) is passed locally: list order suffices;
- activations live from F to B (or W for a split backward): a per-rank `act` buffer (never full) counts them,
  so `buffers` in the report is the peak number of live activations per rank.
UNSHARD / RESHARD / REDUCE_GRAD are not simulated (no FSDP or data-parallel model here); they are counted.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.sim.ir import Cost, Op, Program, RankProgram
from distdoctor.sim.plans.schedule_actions import COMMS, COMPUTE, Act

COMM_MODELS = ("nccl", "coalesced", "ideal")


@dataclass(frozen=True)
class ScheduleTiming:
    fwd_us: float = 1000.0
    bwd_us: float = 2000.0  # a full backward (B); I and W split it
    bwd_input_us: float | None = None  # default: half of bwd_us
    bwd_weight_us: float | None = None  # default: half of bwd_us
    p2p_us: float = 50.0
    p2p_bytes: int = 0
    eager_bytes: int = 0  # per-channel buffer: sends that fit complete before their receive (0: rendezvous)

    def compute_us(self, kind: str) -> float:
        if kind == "F":
            return self.fwd_us
        if kind == "B":
            return self.bwd_us
        if kind == "I":
            return self.bwd_us / 2 if self.bwd_input_us is None else self.bwd_input_us
        return self.bwd_us / 2 if self.bwd_weight_us is None else self.bwd_weight_us


def _needs_recv(x: Act, stage_to_rank: dict[int, int], num_stages: int) -> str | None:
    """The event a compute waits for: its input received from another rank (None: no transfer)."""
    if x.kind == "F" and x.stage > 0 and stage_to_rank[x.stage - 1] != stage_to_rank[x.stage]:
        return f"recvF_s{x.stage}_mb{x.mb}"
    if x.kind in ("B", "I") and x.stage < num_stages - 1 and stage_to_rank[x.stage + 1] != stage_to_rank[x.stage]:
        return f"recvB_s{x.stage}_mb{x.mb}"
    return None


def _peer_stream(r: int, x: Act, stage_to_rank: dict[int, int]) -> str:
    forward = x.kind in ("SEND_F", "RECV_F")
    other = x.stage + (1 if forward == x.kind.startswith("SEND") else -1)
    peer = stage_to_rank[other]
    n = len(set(stage_to_rank.values()))
    return "p2p_next" if peer == (r + 1) % n else "p2p_prev" if peer == (r - 1) % n else f"p2p_r{peer}"


def _transfer(x: Act, stage_to_rank: dict[int, int], timing: ScheduleTiming) -> Op:
    forward = x.kind in ("SEND_F", "RECV_F")
    src = x.stage if x.kind.startswith("SEND") else (x.stage - 1 if forward else x.stage + 1)
    dst = src + 1 if forward else src - 1
    peer = stage_to_rank[dst] if x.kind.startswith("SEND") else stage_to_rank[src]
    name = f"{'act' if forward else 'grad'} s{src}->s{dst} mb{x.mb}"
    return Op("send" if x.kind.startswith("SEND") else "recv", name, timing.p2p_us, bytes=timing.p2p_bytes,
              peer=peer)


def actions_to_program(actions: dict[int, list[Act | None]], stage_to_rank: dict[int, int], num_stages: int,
                       microbatches: int, timing: ScheduleTiming, source: str,
                       comm_model: str = "nccl") -> tuple[Program, dict[str, int]]:
    """The program torch's runtime would run for these (checked, communication-complete) action lists, and
    how many actions of each kind were left out of the simulation."""
    skipped: dict[str, int] = {}
    ranks: dict[int, RankProgram] = {}
    durations = {k: timing.compute_us(k) for k in COMPUTE}
    for r in sorted(actions):
        streams: dict[str, list[Op]] = {"compute": [], "p2p": []}
        compute = streams["compute"]
        last_compute = None  # event recorded after the latest compute issued on this rank
        produced: dict[tuple[int, str, int], str] = {}  # (stage, kind, mb) -> event after that compute
        n = 0
        for a in actions[r]:
            for x in () if a is None else a.leaves():
                if x.kind in COMPUTE:
                    ev = _needs_recv(x, stage_to_rank, num_stages)
                    if ev:
                        compute.append(Op("wait", event=ev))
                    if x.kind == "F":
                        compute.append(Op("acquire", buffer="act"))
                    compute.append(Op("compute", f"{x.stage}{x.kind}{x.mb}", durations[x.kind]))
                    if x.kind in ("B", "W"):
                        compute.append(Op("release", buffer="act"))
                    n += 1
                    last_compute = produced[(x.stage, x.kind, x.mb)] = f"c{n}"
                    compute.append(Op("record", event=last_compute))
                elif x.kind in COMMS:
                    send = x.kind.startswith("SEND")
                    if comm_model == "nccl":
                        stream, after = streams.setdefault(_peer_stream(r, x, stage_to_rank), []), last_compute
                    elif comm_model == "coalesced":
                        stream, after = streams["p2p"], last_compute
                    else:
                        stream = streams.setdefault(_peer_stream(r, x, stage_to_rank).replace(
                            "p2p", "send" if send else "recv"), [])
                        after = (produced.get((x.stage, "F", x.mb)) if x.kind == "SEND_F" else
                                 produced.get((x.stage, "B", x.mb)) or produced.get((x.stage, "I", x.mb))) \
                            if send else None
                    if after:
                        stream.append(Op("wait", event=after))
                    stream.append(_transfer(x, stage_to_rank, timing))
                    if not send:
                        stream.append(Op("record", event=f"recv{x.kind[-1]}_s{x.stage}_mb{x.mb}"))
                else:
                    skipped[x.kind] = skipped.get(x.kind, 0) + 1
        stages_here = sum(1 for rr in stage_to_rank.values() if rr == r)
        ranks[r] = RankProgram(buffers={"act": max(1, stages_here * microbatches)},
                               streams={k: v for k, v in streams.items() if v or k == "compute"})
    return Program(groups={}, ranks=ranks, cost=Cost(), source=source, eager_bytes=timing.eager_bytes), skipped
