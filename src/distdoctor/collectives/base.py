"""The shape every collective spec has (nccl-tests style): one small class per collective.

A spec states the facts about one collective that validate, bench, the simulator's cost model and the
hang analyzer's size checks all use, so each fact lives in exactly one place:
- `bus_factor(n)`: nccl-tests' busbw = algbw * bus_factor(n), for a group of n ranks;
- `size_bytes(count, itemsize, n)`: the "size" column of nccl-tests (what algbw divides by);
- `out_numel(in_numel, n)`: per-rank output elements given per-rank input elements (analyzer size checks);
- `rooted`: whether it has a root (src/dst) that every member must agree on.
Execution parts (deterministic inputs from (seed, rank), the float64 reference, how to call torch) are added
by each spec beside these facts.
"""

from __future__ import annotations


class CollectiveSpec:
    name: str = ""
    rooted: bool = False
    # Names this collective goes by in traces (Flight Recorder profiling names, torch function names).
    aliases: tuple[str, ...] = ()

    def bus_factor(self, n: int) -> float:
        raise NotImplementedError

    def size_bytes(self, count: int, itemsize: int, n: int) -> int:
        """nccl-tests' size column for `count` elements per rank buffer (see each spec)."""
        return count * itemsize

    def out_numel(self, in_numel: int, n: int) -> int:
        return in_numel

    def __repr__(self) -> str:
        return f"<collective {self.name}>"
