"""FSDP / HSDP all-gathers on shared or per-group unshard streams, with prefetch, as IR.

The plan (after the 2-D FSDP setup of pytorch/pytorch#116611): N ranks; most units are sharded over all ranks
(group `global`), every `local_every`-th unit over a shard group of S ranks (`shard{j}` = ranks j*S ..
j*S+S-1, the "HSDP" units). Forward visits units 0..U-1, backward U-1..0; each visit all-gathers the unit's
parameters first (resharded after use), backward also reduce-scatters the unit's gradients on a `reduce`
stream after its backward compute.

Issue order and prefetch: the CPU issues the all-gather of unit u+K before the compute of unit u (prefetch
K), in visit order, onto the unshard stream of the unit's group: one stream `unshard` (shared) or one per
group kind, `unshard_global` / `unshard_local` (per-group). Before computing unit u, the compute stream calls
`wait_stream(unshard stream of u)`: it waits for *everything enqueued on that stream so far* — encoded as
`wait ag_done{j}` on the event recorded after the last all-gather j issued on that stream by then. On a
shared stream that includes prefetched all-gathers of the other group (a slow global all-gather the local
unit does not need): the needless wait the simulator measures. Collective order per group is the same in
both variants, so both compute the same thing; only the waiting differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.errors import InputError
from distdoctor.sim.ir import Cost, Op, Program, RankProgram


@dataclass(frozen=True)
class FsdpConfig:
    ranks: int = 8
    shard_group: int = 4
    units: int = 8
    unshard_streams: str = "shared"
    prefetch: int = 1
    compute_us: float = 100.0
    ag_us_global: float = 300.0
    ag_us_local: float = 50.0
    local_every: int = 2
    backward: bool = True
    steps: int = 1

    def check(self) -> None:
        if self.ranks < 1 or self.units < 1 or self.steps < 1:
            raise InputError("--ranks/--units/--steps", "must be at least 1")
        if self.shard_group < 1 or self.ranks % self.shard_group:
            raise InputError("--shard-group", f"must divide --ranks ({self.ranks}); got {self.shard_group}")
        if self.unshard_streams not in ("shared", "per-group"):
            raise InputError("--unshard-streams", f"must be shared or per-group (got {self.unshard_streams!r})")
        if self.prefetch < 0:
            raise InputError("--prefetch", f"must not be negative (got {self.prefetch})")
        if min(self.compute_us, self.ag_us_global, self.ag_us_local) < 0:
            raise InputError("--compute-us/--ag-us-global/--ag-us-local", "durations must not be negative")
        ops = self.ranks * self.units * self.steps * (8 if self.backward else 3)
        if ops > 60_000_000:
            raise InputError("plan", f"about {ops:,} ops is more than this simulator holds in memory")
        if self.local_every < 1:
            raise InputError("--local-every", f"must be at least 1 (got {self.local_every})")


def build_fsdp(cfg: FsdpConfig) -> Program:
    cfg.check()
    N, S, U, K = cfg.ranks, cfg.shard_group, cfg.units, cfg.prefetch
    groups = {"global": list(range(N))}
    for j in range(N // S):
        groups[f"shard{j}"] = list(range(j * S, (j + 1) * S))

    def is_local(u: int) -> bool:
        return u % cfg.local_every == cfg.local_every - 1

    def stream_of(u: int) -> str:
        if cfg.unshard_streams == "shared":
            return "unshard"
        return "unshard_local" if is_local(u) else "unshard_global"

    ranks: dict[int, RankProgram] = {}
    for r in range(N):
        local = f"shard{r // S}"
        streams: dict[str, list[Op]] = {"compute": []}
        compute = streams["compute"]
        for step in range(cfg.steps):
            passes = [("f", list(range(U)))] + ([("b", list(range(U - 1, -1, -1)))] if cfg.backward else [])
            for phase, visit in passes:
                issued = 0  # all-gathers issued so far in this pass (visit positions)
                last_on: dict[str, str] = {}  # unshard stream -> event after its last issued all-gather
                for pos, u in enumerate(visit):
                    while issued < len(visit) and issued <= pos + K:  # prefetch: issue ahead of compute
                        v = visit[issued]
                        st = stream_of(v)
                        tag = f"{phase}{step}_u{v}"
                        group = local if is_local(v) else "global"
                        us = cfg.ag_us_local if is_local(v) else cfg.ag_us_global
                        streams.setdefault(st, []).extend([
                            Op("collective", f"ag_{tag}", us, group=group, kind="all_gather"),
                            Op("record", event=f"ag_done_{tag}")])
                        last_on[st] = f"ag_done_{tag}"
                        issued += 1
                    tag = f"{phase}{step}_u{u}"
                    compute.append(Op("wait", event=last_on[stream_of(u)]))  # wait_stream semantics
                    mult = 1 if phase == "f" else 2
                    compute.append(Op("compute", f"{'fwd' if phase == 'f' else 'bwd'}_{tag}",
                                      cfg.compute_us * mult))
                    if phase == "b":
                        compute.append(Op("record", event=f"bwd_done_{tag}"))
                        us = cfg.ag_us_local if is_local(u) else cfg.ag_us_global
                        streams.setdefault("reduce", []).extend([
                            Op("wait", event=f"bwd_done_{tag}"),
                            Op("collective", f"rs_{tag}", us, group=local if is_local(u) else "global",
                               kind="reduce_scatter")])
        ranks[r] = RankProgram(streams=streams)
    name = f"fsdp-{cfg.unshard_streams}-N{N}-S{S}-U{U}-K{K}"
    return Program(groups=groups, ranks=ranks, cost=Cost(), source=name)
