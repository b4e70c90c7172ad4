"""The shape every collective spec has (nccl-tests style): one small class per collective.

A spec states the facts about one collective that validate, bench, the simulator's cost model and the
hang analyzer's size checks all use, so each fact lives in exactly one place:
- `bus_factor(n)`: nccl-tests' busbw = algbw * bus_factor(n), for a group of n ranks;
- `size_bytes(count, itemsize, n)`: the "size" column of nccl-tests (what algbw divides by);
- `out_numel(in_numel, n)`: per-rank output elements given per-rank input elements (analyzer size checks);
- `rooted`: whether it has a root (src/dst) that every member must agree on;
- `reduces`: whether it combines the members' data with a reduction op (its trace entries carry one).

Execution parts (used by validate and bench, never by the analyzer, so torch is imported lazily):
- `variants(n)`: the calls to check on a group of n ranks: form (list/tensor, even/uneven splits), in-place
  or not, reduction op, root (a group rank). Every root is covered for rooted ops.
- `inputs(...)`: deterministic per-rank values from (seed, op, variant, group members, group rank, count),
  small integers chosen so that the exact result is representable in every dtype checked (sums of values in
  [-4, 4], products of +-1 and at most four 2s), so most checks are bit-exact; AVG and large worlds rely on
  the per-dtype tolerance instead.
- `expected(...)`: this rank's exact output computed independently in float64 from every member's inputs
  (each rank can regenerate every other rank's inputs), never from a reference run; None when the rank has
  no defined output (reduce/gather off the root).
- `prepare(...)`: buffers plus a `call()` closure doing the torch.distributed call on them, so bench times the
  bare call and validate checks the same call.
`count` follows nccl-tests: per-rank input elements, except reduce_scatter (per-rank output) and all_to_all
(per-rank send buffer, rounded down to a multiple of n for even splits).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable

REDOPS = ("sum", "avg", "max", "min", "prod")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
# nccl-tests' names, for the bench table people diff against nccl-tests output.
NCCL_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "half", "bfloat16": "bfloat16",
                   "int32": "int32", "int64": "int64", "int8": "int8", "uint8": "uint8"}
# Machine epsilon per dtype; integers are exact.
_EPS = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def itemsize(name: str) -> int:
    return {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "int8": 1,
            "uint8": 1}[name]


def tolerance(dtype: str, scale: float, n: int) -> float:
    """Largest acceptable |actual - expected| for a result of magnitude `scale` reduced over n ranks.

    Integers: 0. Floats: a few ulps of the result, growing with log2(n) for a tree/ring of roundings; exact
    cases (small integers) come out at 0 anyway, this only admits legitimate rounding (AVG, large worlds).
    """
    eps = _EPS.get(dtype)
    if eps is None:
        return 0.0
    return 2.0 * eps * max(1.0, scale) * max(1, n.bit_length())


def torch_redop(redop: str):
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}[redop]


def reduce_ranks(values_of, n: int, redop: str):
    """Reduce `values_of(g)` (float64) over g = 0..n-1 one rank at a time: memory stays at two buffers
    whatever n is (a stack of n inputs would not fit for big worlds and sizes)."""
    import torch

    acc = values_of(0).clone()
    for g in range(1, n):
        x = values_of(g)
        if redop in ("sum", "avg"):
            acc += x
        elif redop == "prod":
            acc *= x
        elif redop == "max":
            torch.maximum(acc, x, out=acc)
        elif redop == "min":
            torch.minimum(acc, x, out=acc)
        else:
            raise ValueError(f"unknown reduction {redop!r}")
    return acc / n if redop == "avg" else acc


@dataclass(frozen=True)
class Variant:
    """One way to call a collective: form, in-place or not, reduction op, root (a group rank)."""

    form: str = ""
    inplace: bool = False
    redop: str | None = None
    root: int | None = None

    def label(self) -> str:
        parts = [self.form] if self.form else []
        if self.redop:
            parts.append(self.redop)
        if self.root is not None:
            parts.append(f"root={self.root}")
        parts.append("in-place" if self.inplace else "out-of-place")
        return " ".join(parts)


@dataclass(frozen=True)
class GroupView:
    """The group a call runs on as one rank sees it: member global ranks (ordered) and this rank's index."""

    members: tuple[int, ...]
    rank: int  # group rank
    handle: Any = None  # torch ProcessGroup; None = the default group

    @property
    def size(self) -> int:
        return len(self.members)


@dataclass
class Prepared:
    """Buffers of one call on one rank. `call()` is the bare torch.distributed call (what bench times)."""

    call: Callable[[], None]
    output: Callable[[], Any]  # the tensor holding this rank's result, or None
    refill: Callable[[], None]  # restore inputs (the call may have overwritten them)
    count: int  # the count actually used (all_to_all rounds it)


class CollectiveSpec:
    name: str = ""
    rooted: bool = False
    # Whether the call combines the members' data with a reduction op (sum, max, ...): its trace entries carry one.
    reduces: bool = False
    # Names this collective goes by in traces (Flight Recorder profiling names, torch function names).
    aliases: tuple[str, ...] = ()

    # ---- facts -------------------------------------------------------------------------------------------
    def bus_factor(self, n: int) -> float:
        raise NotImplementedError

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        """nccl-tests' size column for `count` elements per rank buffer (see each spec)."""
        return count * itemsize

    def out_numel(self, in_numel: int, n: int) -> int:
        return in_numel

    # ---- execution ---------------------------------------------------------------------------------------
    # True when every member must end with the same output (compared by hash across ranks).
    replicated: bool = False
    # Whether the call carries data (barrier does not: it is checked once per group, not per dtype/size).
    has_data: bool = True

    def variants(self, n: int) -> list[Variant]:
        raise NotImplementedError

    def bench_variants(self, n: int, redop: str, root: int) -> dict[bool, Variant | None]:
        """The variant bench times in its out-of-place (False) and in-place (True) columns; None = torch has
        no such form of this call."""
        raise NotImplementedError

    def effective_count(self, count: int, n: int, variant: Variant) -> int:
        return count

    def value_kind(self, variant: Variant) -> str:
        return variant.redop or "move"

    def inputs(self, variant: Variant, count: int, seed: int, members: tuple[int, ...], grank: int):
        """float64 input of group rank `grank` (numel = count unless the spec says otherwise)."""
        return rank_values(seed, self.name, variant, members, grank, count, self.value_kind(variant))

    def expected(self, variant: Variant, count: int, seed: int, members: tuple[int, ...], grank: int):
        raise NotImplementedError

    def prepare(self, variant: Variant, count: int, dtype: str, seed: int, group: GroupView, device) -> Prepared:
        raise NotImplementedError

    def all_inputs(self, variant: Variant, count: int, seed: int, members: tuple[int, ...]):
        import torch

        return torch.stack([self.inputs(variant, count, seed, members, g) for g in range(len(members))]) \
            if count else torch.zeros((len(members), 0), dtype=torch.float64)

    def __repr__(self) -> str:
        return f"<collective {self.name}>"


def rank_values(seed: int, op: str, variant: Variant, members: tuple[int, ...], grank: int, numel: int,
                kind: str):
    """Deterministic float64 values for one rank's buffer; the same on every process that asks.

    The stream is keyed by a CRC of (seed, op, variant, members, group rank, numel) so that two groups or two
    ranks never share data (cross-talk between groups or a misplaced chunk shows up as a wrong value).
    """
    import torch

    key = f"{seed}|{op}|{variant.form}|{variant.redop}|{variant.root}|{members}|{grank}|{numel}".encode()
    gen = torch.Generator().manual_seed(zlib.crc32(key))
    if kind in ("sum", "avg"):
        return torch.randint(-4, 5, (numel,), generator=gen, dtype=torch.float64)
    if kind == "prod":
        signs = torch.randint(0, 2, (numel,), generator=gen, dtype=torch.float64) * 2 - 1
        if grank < 4:  # at most four ranks contribute a 2 per element: |product| <= 16, exact everywhere
            twos = (torch.arange(numel) + grank) % 4 == 0
            signs[twos] *= 2
        return signs
    # max/min and pure data movement: a wider range, so misplaced elements rarely match by chance
    return torch.randint(-100, 101, (numel,), generator=gen, dtype=torch.float64)


def cast(values, dtype: str, device):
    return values.to(device=device, dtype=torch_dtype(dtype))
