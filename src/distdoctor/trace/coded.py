"""A Flight Recorder trace's entries in compact form: rows of shared values, codes, per-entry arrays.

A dump holds a handful of distinct combinations of an entry's repeating fields (group, op, sizes, dtypes,
state, thread) and per entry only a few integers and times. The JSON readers build this form; the trace model
gets its columns from it (CodedEntries.columns), the parallel loader sends it between processes as a few
arrays, and the per-rank summary is computed from it without a Python loop per entry (trace/summary.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distdoctor.trace.model import ENTRY_FIELDS

# The Entry fields a Flight Recorder dump fills, in the model's field order: the order rows are built in by the
# readers (flight_recorder._parse_entry) and by CodedEntries.entry.
DUMP_FIELDS = ("index", "group", "op", "seq", "p2p_seq", "raw_op", "in_sizes", "out_sizes", "in_dtypes",
               "out_dtypes", "root", "peer", "reduce_op", "state", "t_created", "t_started", "t_completed",
               "async_op", "stream", "frames")
assert ENTRY_FIELDS[:len(DUMP_FIELDS)] == DUMP_FIELDS, "the trace model's field order changed"


# The fields of a row: the values an entry takes from its distinct combination of repeating fields.
CODED_FIELDS = ("group", "op", "raw_op", "in_sizes", "out_sizes", "in_dtypes", "out_dtypes", "state", "stream",
                "peer")


@dataclass
class CodedEntries:
    """A JSON dump's entries as a few arrays: each entry points at a row of the values it shares with many
    others (a dump holds a handful of distinct rows) and carries its own integers and times. Expanded into the
    model's columns where the trace is used; cheap to send between processes (the parallel loader does).

    The per-entry values are numpy arrays (from the scanner) or lists (from the per-entry reader): `seq` and
    `p2p_seq` as (int64 values, unknown mask) or lists with None, times as float64 seconds with NaN for unknown
    or lists with None."""
    rows: list[tuple]  # values of CODED_FIELDS, one tuple per row
    p2p_rows: list[bool]  # the row is a send or a receive: its entries' sequence number is the p2p one
    codes: np.ndarray  # entry -> row
    index: np.ndarray | list
    seq: tuple | list
    p2p_seq: tuple | list
    times: list  # created, started, completed
    frames: list | None  # per entry; None: none has any

    fields = property(lambda self: DUMP_FIELDS)

    def __len__(self) -> int:
        return len(self.codes)

    def columns(self) -> list[list]:
        """The model's columns, in ENTRY_FIELDS order up to `frames` (the fields a dump fills)."""
        return [self.column(name) for name in DUMP_FIELDS]

    def column(self, name: str) -> list:
        """One field of every entry, as the model has it."""
        n = len(self.codes)
        if name in _ROW_FIELD:
            k = _ROW_FIELD[name]
            return list(map([row[k] for row in self.rows].__getitem__, self.codes.tolist()))
        if name == "seq":
            return _known(self.seq, self._p2p())
        if name == "p2p_seq":
            p2p = self._p2p()
            return [None] * n if p2p is None else _known(self.p2p_seq, ~p2p)
        if name == "index":
            return self.index.tolist() if isinstance(self.index, np.ndarray) else list(self.index)
        if name in _TIME_FIELD:
            return _known(self.times[_TIME_FIELD[name]])
        if name == "frames":
            return self.frames if self.frames is not None else [[]] * n  # one shared empty list
        return [None] * n  # root, reduce_op, async_op: a dump does not give them

    def entry(self, i: int) -> list:
        """Entry i's values, in `fields` order (the same as column(name)[i] for every field)."""
        code = int(self.codes[i])
        row = self.rows[code]
        p2p = self.p2p_rows[code]
        group, op, raw_op, in_sizes, out_sizes, in_dtypes, out_dtypes, state, stream, peer = row
        index = self.index[i]
        return [int(index) if isinstance(self.index, np.ndarray) else index, group, op,
                None if p2p else _known_at(self.seq, i), _known_at(self.p2p_seq, i) if p2p else None,
                raw_op, in_sizes, out_sizes, in_dtypes, out_dtypes, None, peer, None, state,
                *(_known_at(t, i) for t in self.times), None, stream,
                self.frames[i] if self.frames is not None else []]

    def take(self, positions: list[int]) -> CodedEntries:
        """Only the entries at `positions` (in that order), sharing the rows."""
        at = np.asarray(positions, np.intp)

        def pick(values):
            if isinstance(values, tuple):
                return values[0][at], values[1][at]
            if isinstance(values, np.ndarray):
                return values[at]
            return [values[i] for i in positions]

        return CodedEntries(self.rows, self.p2p_rows, self.codes[at], pick(self.index), pick(self.seq),
                            pick(self.p2p_seq), [pick(t) for t in self.times],
                            None if self.frames is None else [self.frames[i] for i in positions])

    def _p2p(self) -> np.ndarray | None:
        """Entries whose row is a send or a receive (None: no such row)."""
        return np.array(self.p2p_rows)[self.codes] if any(self.p2p_rows) else None


_ROW_FIELD = {name: k for k, name in enumerate(CODED_FIELDS)}
_TIME_FIELD = {"t_created": 0, "t_started": 1, "t_completed": 2}


def _known_at(values, i: int):
    """One value of a column given as _known takes it."""
    if isinstance(values, tuple):
        return None if values[1][i] else int(values[0][i])
    if isinstance(values, np.ndarray):
        value = float(values[i])
        return None if value != value else value  # NaN: unknown
    return values[i]


def _known(values, unknown: np.ndarray | None = None) -> list:
    """A column as a list, None where unknown: from (int64 values, unknown mask), float64 with NaN, or a list
    with None; `unknown` adds entries whose value belongs to the other sequence (p2p or collective)."""
    if isinstance(values, tuple):
        values, mask = values
        mask = mask if unknown is None else mask | unknown
    elif isinstance(values, np.ndarray):
        mask = np.isnan(values) if unknown is None else np.isnan(values) | unknown
    else:
        return list(values) if unknown is None else [None if u else v for v, u in zip(values, unknown.tolist())]
    out = values.tolist()
    for i in np.flatnonzero(mask).tolist():
        out[i] = None
    return out
