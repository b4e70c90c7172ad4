"""A rank's entries in compact form: rows of shared values, one code per entry, per-entry arrays.

A dump holds a handful of distinct combinations of an entry's repeating fields (group, op, sizes, dtypes,
state, thread) and per entry only a few integers and times. Every Flight Recorder reader builds this form; the
analysis reads its fields by name (`column`), the per-rank summary and the streamed digest are computed from it
without a Python loop per entry (trace/summary.py, loaders/stream.py), the parallel loader sends it between
processes as a few arrays, and an `Entry` is built only where one is read. Traces built in memory (the
recorder's, the simulator's) are lists of `Entry`; `Entries.of` gives their compact form where a whole-trace
computation needs it. Read-only: rows are shared between entries (and between ranks after a parallel load).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from distdoctor.trace.model import ENTRY_FIELDS, Entry


class Row(NamedTuple):
    """The values an entry shares with the others of its row (every Entry field but its own integers, times
    and frames)."""
    group: str
    op: str
    raw_op: str = ""
    in_sizes: list = []
    out_sizes: list = []
    in_dtypes: list = []
    out_dtypes: list = []
    root: int | None = None
    peer: int | None = None
    reduce_op: str | None = None
    state: str = "issued"
    async_op: bool | None = None
    stream: str | None = None
    error: str | None = None


# The fields each entry has of its own: integers as (int64 values, unknown mask), times as float64 seconds with
# NaN for unknown, or either as a plain list (with None) where the values are not those (a trace built in memory).
OWN_FIELDS = tuple(name for name in ENTRY_FIELDS if name not in Row._fields and name != "frames")


class Entries(Sequence):
    """A rank's entries: entry i has row `rows[codes[i]]`, its own values `own[name][i]` and the stack
    `stacks[stack_codes[i]]` (stacks None: no entry has one)."""

    __slots__ = ("rows", "codes", "own", "stacks", "stack_codes", "_built", "_columns")

    def __init__(self, rows: list[Row], codes: np.ndarray, own: dict, stacks: list | None = None,
                 stack_codes: np.ndarray | None = None) -> None:
        self.rows, self.codes, self.own, self.stacks, self.stack_codes = rows, codes, own, stacks, stack_codes
        self._built: list[Entry | None] = [None] * len(codes)
        self._columns: dict[str, list] = {}

    @classmethod
    def of(cls, entries) -> Entries:
        """The compact form of any rank's entries (a list of Entry: rows numbered first seen first)."""
        if isinstance(entries, cls):
            return entries
        position: dict = {}
        rows: list[Row] = []
        codes = np.empty(len(entries), np.intp)
        for i, e in enumerate(entries):
            row = Row(e.group, e.op, e.raw_op, e.in_sizes, e.out_sizes, e.in_dtypes, e.out_dtypes, e.root, e.peer,
                      e.reduce_op, e.state, e.async_op, e.stream, e.error)
            key = frozen(row)
            k = position.get(key)
            if k is None:
                k = position[key] = len(rows)
                rows.append(row)
            codes[i] = k
        own = {name: [getattr(e, name) for e in entries] for name in OWN_FIELDS}
        return cls(rows, codes, own, *stacks_of([e.frames for e in entries], frozen))

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        e = self._built[i]
        if e is None:
            i = range(len(self))[i]  # (a negative index; IndexError beyond the end)
            row = self.rows[int(self.codes[i])]
            own = {name: _known_at(values, i) for name, values in self.own.items()}
            frames = self.stacks[int(self.stack_codes[i])] if self.stacks is not None else []
            e = self._built[i] = Entry(**own, **row._asdict(), frames=frames)
        return e

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, (list, Entries)) and list(self) == list(other)

    __hash__ = None  # mutable-looking container: unhashable, like list

    def __getstate__(self):
        return self.rows, self.codes, self.own, self.stacks, self.stack_codes

    def __setstate__(self, state) -> None:
        self.__init__(*state)

    def column(self, name: str) -> list:
        """One field of every entry, as the model has it (built once, on first read)."""
        got = self._columns.get(name)
        if got is None:
            if name in Row._fields:
                k = Row._fields.index(name)
                got = list(map([row[k] for row in self.rows].__getitem__, self.codes.tolist()))
            elif name in self.own:
                got = _known(self.own[name])
            elif name == "frames" and self.stacks is not None:
                got = list(map(self.stacks.__getitem__, self.stack_codes.tolist()))
            elif name == "frames":
                got = [[]] * len(self)  # one shared empty list
            elif name in OWN_FIELDS:
                got = [None] * len(self)  # a field this source does not give
            else:
                raise KeyError(name)
            self._columns[name] = got
        return got

    def known_bounds(self, name: str) -> tuple | None:
        """(lowest, highest) of an own integer field's known values, () when none is known; None when the field
        is not held as int64 arrays (then the caller reads the column)."""
        values = self.own.get(name)
        if not isinstance(values, tuple):
            return None
        known = values[0][~values[1]]
        return (int(known.min()), int(known.max())) if len(known) else ()

    def row_values(self, name: str) -> list:
        """One Row field of every row (a whole-trace computation reads rows, then maps them by `codes`)."""
        return [getattr(row, name) for row in self.rows]

    def take(self, positions: list[int]) -> Entries:
        """Only the entries at `positions` (in that order), sharing the rows."""
        at = np.asarray(positions, np.intp)

        def pick(values):
            if isinstance(values, tuple):
                return values[0][at], values[1][at]
            if isinstance(values, np.ndarray):
                return values[at]
            return [values[i] for i in positions]

        return Entries(self.rows, self.codes[at], {name: pick(v) for name, v in self.own.items()}, self.stacks,
                       None if self.stacks is None else self.stack_codes[at])


def stacks_of(frames: list, key) -> tuple[list | None, np.ndarray | None]:
    """(Each distinct stack, numbered first seen first; each entry's) of every entry's frames, compared by
    `key(stack)`; (None, None) when no entry has any."""
    if not any(frames):
        return None, None
    keys = list(map(key, frames))
    position: dict = {}
    stacks = []
    for k, stack in zip(keys, frames):
        if k not in position:
            position[k] = len(stacks)
            stacks.append(stack)
    return stacks, np.fromiter(map(position.__getitem__, keys), np.intp, len(keys))


def int_arrays(values: list):
    """(int64 values, unknown mask) of a list of ints and None; None when one does not fit."""
    try:
        if None not in values:
            return np.array(values, np.int64), np.zeros(len(values), bool)
        return (np.array([0 if v is None else v for v in values], np.int64),
                np.fromiter((v is None for v in values), bool, len(values)))
    except (OverflowError, TypeError, ValueError):
        return None


def frozen(value):
    """A hashable copy of a row, a size/dtype list or a frame list."""
    if isinstance(value, (list, tuple)):
        return tuple(map(frozen, value))
    if hasattr(value, "filename"):  # a Frame
        return value.name, value.filename, value.line
    return value


def _known_at(values, i: int):
    """One value of an own column."""
    if isinstance(values, tuple):
        return None if values[1][i] else int(values[0][i])
    if isinstance(values, np.ndarray):
        value = float(values[i])
        return None if value != value else value  # NaN: unknown
    return values[i]


def _known(values) -> list:
    """An own column as a list, None where unknown."""
    if isinstance(values, tuple):
        values, mask = values
    elif isinstance(values, np.ndarray):
        mask = np.isnan(values)
    else:
        return list(values)
    out = values.tolist()
    for i in np.flatnonzero(mask).tolist():
        out[i] = None
    return out


