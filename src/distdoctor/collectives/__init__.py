"""Registry of collective specs: name -> spec. The one source of truth for every collective fact."""

from __future__ import annotations

from distdoctor.collectives.all_gather import AllGather
from distdoctor.collectives.all_reduce import AllReduce
from distdoctor.collectives.all_to_all import AllToAll
from distdoctor.collectives.barrier import Barrier
from distdoctor.collectives.base import CollectiveSpec
from distdoctor.collectives.broadcast import Broadcast
from distdoctor.collectives.gather import Gather
from distdoctor.collectives.names import COALESCED, canonical_dtype, same_collective
from distdoctor.collectives.p2p import SendRecv
from distdoctor.collectives.reduce import Reduce
from distdoctor.collectives.reduce_scatter import ReduceScatter
from distdoctor.collectives.scatter import Scatter

SPECS: dict[str, CollectiveSpec] = {
    spec.name: spec
    for spec in (AllReduce(), Broadcast(), Reduce(), AllGather(), ReduceScatter(), AllToAll(), Gather(), Scatter(),
                 SendRecv(), Barrier())
}

_ALIASES: dict[str, str] = {alias: spec.name for spec in SPECS.values() for alias in (spec.name, *spec.aliases)}
# The collectives that combine data with a reduction op (what a trace entry's reduce_op is about).
REDUCING_OPS = frozenset(name for name, spec in SPECS.items() if spec.reduces)


def get_spec(name: str) -> CollectiveSpec:
    """The spec for a collective name or alias; KeyError if unknown."""
    return SPECS[_ALIASES[name]]


def canonical_op(name: str) -> str | None:
    """Map a trace's op name ("nccl:all_reduce", "gloo:_allgather_base", "allreduce") to a spec name, or None.

    Point-to-point keeps its direction: "send" or "recv" (both belong to the `sendrecv` spec). Flight Recorder's
    marker of a coalesced block (`nccl:coalesced`) is "coalesced" (names.COALESCED).
    """
    base = name.split(":", 1)[-1].strip().split(" ", 1)[0].lower()
    if base in ("send", "isend"):
        return "send"
    if base in ("recv", "irecv", "recv_anysource"):
        return "recv"
    if base == COALESCED:
        return COALESCED
    return _ALIASES.get(base)


def reduces(name: str) -> bool:
    """Whether collective `name` (a spec name or alias) reduces; False for a name no spec knows."""
    return _ALIASES.get(name) in REDUCING_OPS


def implied_size(op: str, in_numel: int, out_numel: int) -> int:
    """The group size an all_gather's or reduce_scatter's sizes imply (output = n x input, resp. input = n x
    output); 0 where no size does, or where the call moved nothing (empty tensors fit any size)."""
    small, big = (in_numel, out_numel) if op == "all_gather" else (out_numel, in_numel)
    if small <= 0 or big % small:
        return 0
    n = big // small
    return n if get_spec(op).out_numel(in_numel, n) == out_numel else 0


def bus_factor(name: str, n: int) -> float:
    return get_spec(name).bus_factor(n)


__all__ = ["CollectiveSpec", "SPECS", "REDUCING_OPS", "get_spec", "canonical_op", "canonical_dtype", "same_collective",
           "bus_factor", "reduces", "implied_size"]
