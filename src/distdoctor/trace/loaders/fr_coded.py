"""A dump whose entries are dicts (every pickle; JSON the strict reader refused) read into the compact form the
JSON readers build (trace/coded.py): each entry's repeating fields as a code into a few distinct rows, its
integers and times as arrays.

A 16 384-rank set of pickles holds 33 million entries. Read into columns (fr_columns.py), each worker also
summed up, signed and sent every entry one by one; in the compact form the summary and the signatures are numpy
passes over the codes (trace/summary.py, stream.py) and a trimmed trace travels as a few arrays.

The trace is the one fr_columns gives, value for value: a row is interpreted from the first entry that has it,
and two entries share a row only when every value the model takes from them is equal (an equal size, op or
state gives the same interpretation; a dtype or thread name is keyed by its text). Anything else (an entry that
is not a dict, a value of an unexpected type, an integer beyond int64, a missing record_id) returns None and the
column reader takes the dump.
"""

from __future__ import annotations

import collections
import itertools
import operator
from itertools import repeat

import numpy as np

from distdoctor.trace.summary import int_arrays

# What reading a damaged entry may raise: the readers then hand the dump on (the row reader names the entry).
READ_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)
_INT = {int}
_INT_OR_NONE = {int, type(None)}
# The raw fields a row is interpreted from, in flight_recorder._interpret's order.
SHARED_FIELDS = ("process_group", "profiling_name", "input_sizes", "output_sizes", "input_dtypes", "output_dtypes",
                 "state", "retired", "thread_name", "is_p2p")


def coded_parts(entries: list, interner) -> tuple | None:
    """(keys: the raw shared fields of each distinct row, in first-seen order; codes; index; seq; p2p_seq;
    times; frames), as flight_recorder._assemble takes them, or None where the column reader must read the dump."""
    try:
        return _parts(entries, interner)
    except READ_ERRORS:
        return None


# How the pickle reader found each integer field (_fr_pickle_kernel.c): an int, None or missing, anything else.
INT_OK, INT_NONE, INT_OTHER = 0, 1, 2
# The integers each entry has of its own, in the order the compact form takes them.
INT_FIELDS = ("record_id", "collective_seq_id", "p2p_seq_id", "time_created_ns", "time_discovered_started_ns",
              "time_discovered_completed_ns")
# Every field read, in one C call per entry when the entry has them all (torch writes every key in every entry).
_READ = (*SHARED_FIELDS, *INT_FIELDS, "frames")
_READ_ALL = operator.itemgetter(*_READ)


def _columns(entries: list) -> list:
    try:
        return list(zip(*map(_READ_ALL, entries)))
    except KeyError:  # some key is missing somewhere: None there, as dict.get gives
        return [list(map(dict.get, entries, repeat(name))) for name in _READ]


def _parts(entries: list, interner):
    if not entries or not all(e.__class__ is dict for e in entries):
        return None
    *shared, record_id, seq, p2p_seq, t_created, t_started, t_completed, frames = _columns(entries)
    got = _row_codes(shared)
    if got is None:
        return None
    codes, first = got
    rows = [tuple(entries[i].get(f) for f in SHARED_FIELDS) for i in first.tolist()]
    index = _ints(record_id, _INT)
    seq, p2p_seq = _ints(seq, _INT_OR_NONE), _ints(p2p_seq, _INT_OR_NONE)
    times = [_ints(t, _INT_OR_NONE) for t in (t_created, t_started, t_completed)]
    if index is None or seq is None or p2p_seq is None or any(t is None for t in times):
        return None
    return rows, codes, index[0], seq, p2p_seq, [_seconds(*t) for t in times], _frames(frames, interner)


def parts_from_scan(scan, interner) -> tuple | None:
    """coded_parts' result from a pickle read by fr_pickle_scan: its distinct rows keyed as _parts keys the
    entries (so rows that differ only where the model does not look become one, as there), its integers, and
    its distinct stacks, each turned into a frame list once. None where the column reader must read the dump."""
    got = _row_codes([list(column) for column in zip(*scan.rows)])
    if got is None:
        return None
    row_codes, first = got
    rows = [scan.rows[i] for i in first.tolist()]
    state = scan.int_state
    if (state[:, 0] != INT_OK).any() or (state[:, 1:] == INT_OTHER).any():
        return None  # a record_id not an int, or a value of another type: the column reader words it
    known = [(scan.ints[:, j], state[:, j] == INT_NONE) for j in range(len(INT_FIELDS))]
    frames = _frames(scan.stacks, interner)
    if frames is not None:
        frames = list(map(frames.__getitem__, scan.stack_codes.tolist()))
    return (rows, row_codes[scan.codes], known[0][0], known[1], known[2], [_seconds(*t) for t in known[3:]],
            frames)


def _row_codes(shared: list) -> tuple[np.ndarray, np.ndarray] | None:
    """Each entry's row (numbered first seen first) from the columns of its repeating fields (SHARED_FIELDS'
    order), and each row's first entry; None where a value is of a type the compact form does not take."""
    pgs, profiling, in_sizes, out_sizes, in_dtypes, out_dtypes, states, retired, threads, is_p2p = shared
    names = [pg[0] for pg in pgs]
    if set(map(type, names)) != {str} or not all(names):
        return None  # a group named by a number or nothing: the column reader words it as it always has
    if set(map(type, profiling)) != {str}:
        return None
    descs = [pg[1] if len(pg) > 1 else None for pg in pgs]
    keys = zip(names, descs, profiling, _sizes(in_sizes), _sizes(out_sizes), _dtypes(in_dtypes),
               _dtypes(out_dtypes), states, map(bool, retired), _texts(threads), map(bool, is_p2p))
    position = collections.defaultdict(itertools.count().__next__)  # rows numbered first seen first
    codes = np.fromiter(map(position.__getitem__, keys), np.intp, len(pgs))
    _, first = np.unique(codes, return_index=True)  # row k's first entry (codes are in first-seen order)
    return codes, first


_MANY = object()  # tags the key of a size list that is not one list of one tensor's sizes: no dump holds it


_FIRST = operator.itemgetter(0)


def _one_each(values: list) -> bool:
    """Every value a list of one item (one tensor per call: the common case, keyed in C passes below)."""
    return set(map(type, values)) == {list} and set(map(len, values)) == {1}


def _sizes(values: list) -> list:
    """A key per size list: equal keys, equal [[int(d) for d in s] for s in v] (the interner's value)."""
    if _one_each(values):
        return list(map(tuple, map(_FIRST, values)))
    return [tuple(v[0]) if v.__class__ is list and len(v) == 1 else (_MANY, *map(tuple, v)) if v else None
            for v in values]


def _dtypes(values: list) -> list:
    """A key per dtype list (names must be text: the interner keys them by value)."""
    if _one_each(values):
        keys = list(map(_FIRST, values))
        if set(map(type, keys)) == {str}:
            return keys
    return [v[0] if v.__class__ is list and len(v) == 1 and v[0].__class__ is str else _many_dtypes(v)
            for v in values]


def _many_dtypes(value):
    if not value:
        return None
    if value.__class__ is not list or set(map(type, value)) != {str}:
        raise TypeError("dtype names that are not text")
    return tuple(value)


def _texts(values: list) -> list:
    """Thread names, which must be text or nothing (the interner keys them by value)."""
    if not set(map(type, values)) <= {str, type(None)}:
        raise TypeError("a thread name that is not text")
    return values


def _ints(values: list, allowed: set) -> tuple[np.ndarray, np.ndarray] | None:
    """(int64 values, unknown mask), as the scanner gives them; None when a value is not an int (or None where
    `allowed`) or does not fit int64."""
    return int_arrays(values) if set(map(type, values)) <= allowed else None


def _seconds(ns: np.ndarray, unknown: np.ndarray) -> np.ndarray:
    """Seconds as float64, NaN where unknown (0 or None): int(v) / 1e9 is the same IEEE arithmetic in numpy."""
    return np.where(unknown | (ns == 0), np.nan, ns / 1e9)


FRAME_KEY = operator.itemgetter("name", "filename", "line")  # a frame's key in flight_recorder._Interner


def _frames(values: list, interner) -> list | None:
    """Each entry's frame list (the interner's, shared by equal stacks), None when no entry has frames. Keyed
    in C passes: the interner's key per entry, then one frame list per distinct key."""
    if not any(values):
        return None
    if not all(values):
        values = [raw or () for raw in values]  # (no frames: the empty key)
    keys = list(map(tuple, map(map, repeat(FRAME_KEY), values)))
    empty, frame_list = interner.empty_frames, interner.frame_list
    table = {key: frame_list(raw) if key else empty for key, raw in dict(zip(keys, values)).items()}
    return list(map(table.__getitem__, keys))
