"""A Program compiled for the engine: integer-indexed arrays of op tuples, durations computed up front.

Durations: `us` when an op gives it, else the cost model: collectives alpha + bytes * bus_factor(kind, n) /
bandwidth with nccl-tests' bus factors (distdoctor.collectives, the one source of truth); p2p alpha +
bytes / bandwidth. The hot loop sees only ints, floats and tuples (no pydantic, no names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from distdoctor.collectives import bus_factor
from distdoctor.sim.ir import Op, Program

COMPUTE, RECORD, WAIT, ACQUIRE, RELEASE, COLLECTIVE, SEND, RECV = range(8)
_CODES = {"compute": COMPUTE, "record": RECORD, "wait": WAIT, "acquire": ACQUIRE, "release": RELEASE,
          "collective": COLLECTIVE, "send": SEND, "recv": RECV}
_INST = 1 << 32  # instance key = group id * _INST + per-group collective number


def collective_us(op: Op, n: int, alpha_us: float, gbps: float) -> float:
    if op.us is not None:
        return float(op.us)
    if op.kind == "barrier" or n <= 1:
        return alpha_us if n > 1 else 0.0
    return alpha_us + op.bytes * bus_factor(op.kind, n) / (gbps * 1e3)  # GB/s = 1e3 bytes/us


def p2p_us(op: Op, alpha_us: float, gbps: float) -> float:
    return float(op.us) if op.us is not None else alpha_us + op.bytes / (gbps * 1e3)


@dataclass
class Compiled:
    """The program as integer-indexed arrays."""

    program: Program
    streams: list[tuple[int, str]]  # sid -> (rank, stream name)
    ops: list[list[tuple]]  # sid -> compiled ops
    rank_of: list[int]
    group_names: list[str]
    group_members: list[list[int]]
    buffer_keys: list[tuple[int, str]]  # bid -> (rank, name)
    capacity: list[int]
    event_keys: list[tuple[int, str]]
    channels: list[tuple[int, int, str]]  # chan -> (src, dst, tag)
    compute_sids: set[int]
    init_of: dict[int, str] = field(default_factory=dict)  # synthetic gid of a comm_init -> group it creates
    eager_bytes: int = 0  # per-channel buffer for sends that complete without their receiver (0: rendezvous)

    @cached_property
    def sid_of(self) -> dict[tuple[int, str], int]:
        """(rank, stream name) -> sid."""
        return {rs: i for i, rs in enumerate(self.streams)}


def compile_program(prog: Program) -> Compiled:
    from distdoctor.trace.loaders import gc_paused  # lazily: it brings numpy, which sim needs nowhere else

    with gc_paused():  # millions of acyclic tuples: without this the collector rescans them all, again and again
        return _compile(prog)


def _compile(prog: Program) -> Compiled:
    group_names = list(prog.groups)
    gid = {g: i for i, g in enumerate(group_names)}
    members = [list(prog.groups[g]) for g in group_names]
    init_gid: dict[str, int] = {}  # group -> the synthetic group of its comm_init (allocated when first met)
    init_of: dict[int, str] = {}
    gsize = [len(m) for m in members]
    alpha, gbps = prog.cost.alpha_us, prog.cost.gbps
    streams, ops_out, rank_of, buffer_keys, capacity = [], [], [], [], []
    event_keys: list[tuple[int, str]] = []
    chan_id: dict[tuple[int, int, str], int] = {}
    msg_id: dict[str, int] = {}  # p2p op name -> id: a send and the receive it pairs with should agree
    compute_sids = set()
    coll_cache: dict[tuple, float] = {}
    p2p_cache: dict[tuple, float] = {}
    # Generators share one Op object among ranks where the op does not depend on the rank (compute, a
    # group's collective): compile those once, keyed by object identity (the program keeps them alive).
    shared: dict[int, tuple] = {}
    kind_id: dict[str, int] = {}
    for r in sorted(prog.ranks):
        rp = prog.ranks[r]
        bid = {}
        for b, cap in rp.buffers.items():
            bid[b] = len(buffer_keys)
            buffer_keys.append((r, b))
            capacity.append(cap)
        local_events: dict[str, int] = {}
        for s, ops in rp.streams.items():
            sid = len(streams)
            streams.append((r, s))
            rank_of.append(r)
            out = []
            append = out.append
            for op in ops:
                cop = shared.get(id(op))
                if cop is not None:
                    append(cop)
                    if cop[0] == COMPUTE:
                        compute_sids.add(sid)
                    continue
                k = op.op
                if k == "compute":
                    cop = shared[id(op)] = (COMPUTE, float(op.us))
                    append(cop)
                    compute_sids.add(sid)
                elif k == "record" or k == "wait":
                    e = local_events.get(op.event)
                    if e is None:
                        e = local_events[op.event] = len(event_keys)
                        event_keys.append((r, op.event))
                    append((RECORD if k == "record" else WAIT, e))
                elif k == "acquire" or k == "release":
                    append((ACQUIRE if k == "acquire" else RELEASE, bid[op.buffer]))
                elif k == "collective" or k == "comm_init":
                    if k == "collective":
                        g = gid[op.group]
                    else:
                        g = init_gid.get(op.group, -1)
                        if g < 0:
                            g = init_gid[op.group] = len(group_names)
                            init_of[g] = op.group
                            group_names.append(f"init {op.group}")
                            members.append(list(prog.groups[op.group]))
                            gsize.append(len(members[-1]))
                    ck = (op.us, op.kind, op.bytes, gsize[g])
                    d = coll_cache.get(ck)
                    if d is None:
                        d = coll_cache[ck] = (collective_us(op, gsize[g], alpha, gbps) if k == "collective"
                                              else float(op.us) if op.us is not None else alpha)
                    kid = kind_id.setdefault(op.kind, len(kind_id))
                    cop = shared[id(op)] = (COLLECTIVE, g, d, kid, op.bytes)
                    append(cop)
                else:
                    key = (r, op.peer, op.tag) if k == "send" else (op.peer, r, op.tag)
                    ch = chan_id.setdefault(key, len(chan_id))
                    msg = msg_id.setdefault(op.name, len(msg_id)) if op.name else -1
                    pk = (op.us, op.bytes)
                    d = p2p_cache.get(pk)
                    if d is None:
                        d = p2p_cache[pk] = p2p_us(op, alpha, gbps)
                    append((SEND if k == "send" else RECV, ch, d, op.bytes, msg))
            ops_out.append(out)
    return Compiled(prog, streams, ops_out, rank_of, group_names, members, buffer_keys, capacity,
                    event_keys, list(chan_id), compute_sids, init_of, prog.eager_bytes)


def jittered(compiled: Compiled, jitter: float, seed: int, comm: bool = False) -> Compiled:
    """A copy whose compute durations (with `comm`, collective and p2p ones too) are scaled by independent
    factors in [1 - jitter, 1 + jitter].

    Matching that depends on timing (several streams of a rank issuing on one group, buffers shared by
    streams) follows simulated time, so one timing is one interleaving; jittered trials explore others."""
    import random

    rng = random.Random(seed)
    lo = max(0.0, 1.0 - jitter)

    def scaled(op: tuple) -> tuple:
        c = op[0]
        if c == COMPUTE:
            return (COMPUTE, op[1] * rng.uniform(lo, 1.0 + jitter))
        if comm and c in (COLLECTIVE, SEND, RECV):
            return (*op[:2], op[2] * rng.uniform(lo, 1.0 + jitter), *op[3:])
        return op

    ops = [[scaled(op) for op in sops] for sops in compiled.ops]
    return Compiled(compiled.program, compiled.streams, ops, compiled.rank_of, compiled.group_names,
                    compiled.group_members, compiled.buffer_keys, compiled.capacity, compiled.event_keys,
                    compiled.channels, compiled.compute_sids, compiled.init_of, compiled.eager_bytes)
