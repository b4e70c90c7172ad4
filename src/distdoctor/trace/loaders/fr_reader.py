"""The Python Flight Recorder reader: a dump's entries read into the compact form (trace/coded.py), by the field
table (fr_schema.py). The entries come as dicts (from the safe unpickler, or a JSON dump parsed), or as STRICT
records (a JSON dump written as torch writes it, decoded by msgspec from the table's fields): one reading of both.

It is the reference the C readers are tested against and the reader wherever they were not built or hand a
file over. Per field, in C loops over all entries: the row fields of each entry are keyed (lists as tuples,
equal values equal keys, as the interner shares them) and numbered first seen first; each distinct row is
interpreted once from its first entry (fr_schema.interpret); the integers go into int64 arrays, the times into
float64 seconds. A value the model cannot take raises ValueError naming the entry's index and the field (where
the pass over all entries cannot say which, each entry is read alone until one fails: the validator).
"""

from __future__ import annotations

import collections
import itertools
import operator
from itertools import repeat
from typing import Annotated

import msgspec
import numpy as np

from distdoctor.trace.coded import int_arrays, stacks_of
from distdoctor.trace.loaders.fr_schema import (FIELDS, INT64, INT_FIELDS, ROW_FIELDS, EntryError, dtype_names,
                                                frame_list, group_name, interpret, op_of, sizes_of)

READ_ERRORS = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)
FRAME_KEY = operator.itemgetter("name", "filename", "line")  # a frame's key in Interner.frame_list


class Interner:
    """One shared object per distinct value a dump repeats (sizes, dtype lists, names, stacks): entries are
    read-only, and a dump repeats a few of each thousands of times (a worker keeps one for all its dumps)."""

    def __init__(self) -> None:
        self.tables: dict[str, dict] = collections.defaultdict(dict)
        self.empty_frames: list = []

    def _shared(self, table: str, key, make, raw):
        got = self.tables[table].get(key)
        if got is None:
            got = self.tables[table][key] = make(raw)
        return got

    def group(self, raw) -> str:
        return self._shared("groups", raw, group_name, raw)

    def op(self, profiling) -> tuple:
        return self._shared("ops", profiling, op_of, profiling)

    def size_list(self, raw) -> list:
        # keyed without a tuple per shape in the common one-tensor case: a one-shape key is the shape tuple, a
        # many-shape key a tuple of tuples (the two cannot be equal)
        return self._shared("sizes", tuple(raw[0]) if len(raw) == 1 else tuple(map(tuple, raw)), sizes_of, raw) \
            if raw else []

    def str_list(self, raw) -> list:
        return self._shared("dtypes", raw[0] if len(raw) == 1 else tuple(raw), dtype_names, raw) if raw else []

    def text(self, raw) -> str | None:
        return self._shared("texts", raw, str, raw) if raw else None

    def frame_list(self, raw) -> list:
        try:
            return self._shared("frames", tuple(map(FRAME_KEY, raw)), frame_list, raw)
        except TypeError:  # an unhashable name or line (a damaged dump): built as it is, not shared
            return frame_list(raw)


def read_entries(entries, interner: Interner) -> tuple:
    """(rows as fr_schema.interpret gives them, codes, own values by model field, stacks, stack codes) of a dump's
    `entries`. A value the model cannot take: ValueError naming the entry's index and the field (the validator:
    where the pass over all entries cannot say which, each entry is read alone until one fails)."""
    if not isinstance(entries, list):
        raise ValueError(f"'entries' is {type(entries).__name__}, not a list")
    try:
        return _read(entries, interner)
    except EntryError as exc:
        if exc.at is not None:
            raise ValueError(f"entry {exc.at} is malformed ({exc})") from None
        failure: Exception = exc
    except READ_ERRORS as exc:
        failure = exc
    for i, raw in enumerate(entries):
        try:
            _read([raw], interner)
        except EntryError as exc:
            raise ValueError(f"entry {i} is malformed ({exc})") from None
        except READ_ERRORS as exc:
            raise ValueError(f"entry {i} is malformed ({type(exc).__name__}: {exc})") from None
    raise ValueError(f"entries unreadable ({type(failure).__name__}: {failure})")


def _read(entries: list, interner: Interner, typed: bool = False) -> tuple:
    """read_entries' parts of dict entries, or (`typed`) of STRICT records (their row fields hashable as given)."""
    if typed:
        def column(name: str) -> list:
            return list(map(operator.attrgetter(name), entries))
    else:
        for e in entries:
            if e.__class__ is not dict:
                raise TypeError(f"a {type(e).__name__}, not a dict")

        def column(name: str) -> list:
            return list(map(dict.get, entries, repeat(name), repeat(_MISSING)))
    columns = {name: column(name) for name in ROW_FIELDS}
    rows, codes = read_rows(entries, columns, interner, typed)
    p2p = np.array([p2p for _, p2p, _ in rows] or [False])[codes]
    own = {f.model: own_values(f, column(f.name), p2p) for f in INT_FIELDS}
    try:
        frames = column("frames")
        stacks = frames_of([None if v is _MISSING else v for v in frames] if _MISSING in frames else frames,
                           interner)
    except READ_ERRORS as exc:
        raise EntryError("frames", exc) from None
    return rows, codes, own, *stacks


_MISSING = msgspec.UNSET  # a key the entry does not have (STRICT records: a field not given)


def read_rows(entries: list, columns: dict, interner: Interner, typed: bool = False) -> tuple[list, np.ndarray]:
    """Each distinct row (interpret's (Row, p2p), numbered first seen first) and each entry's row."""
    columns = {name: [None if v is _MISSING else v for v in values] if _MISSING in values else values
               for name, values in columns.items()}
    try:
        codes = _codes([columns[name] if typed else _keys(columns[name]) for name in ROW_FIELDS], len(entries))
    except TypeError:  # an unhashable value inside a list: every value keyed one by one
        codes = _codes([list(map(_key, columns[name])) for name in ROW_FIELDS], len(entries))
    _, first = np.unique(codes, return_index=True)  # row k's first entry (codes are in first-seen order)
    rows = []
    for i in first.tolist():
        raw = {name: columns[name][i] for name in ROW_FIELDS} if typed else entries[i]
        try:
            rows.append(interpret(raw, interner))
        except EntryError as exc:
            raise _at(exc, i) from None
    return rows, codes


# The table's fields as torch writes them in a JSON dump, decoded by msgspec straight into records (fields not
# read are skipped, row fields come hashable): the Python reader's fast decoding of a JSON dump. A dump that does
# not fit these types exactly is parsed into dicts instead, and read by the same code.
_I64 = Annotated[int, msgspec.Meta(ge=INT64[0], le=INT64[1])]  # (beyond it, the parsers disagree: dicts)
_STRICT_TYPES = {"process_group": tuple[str, ...], "profiling_name": str, "record_id": _I64,
                 "input_sizes": tuple[tuple[_I64, ...], ...] | None, "output_sizes": tuple[tuple[_I64, ...], ...] | None,
                 "input_dtypes": tuple[str, ...] | None, "output_dtypes": tuple[str, ...] | None,
                 "state": str | None, "retired": bool | None, "thread_name": str | None, "is_p2p": bool | None,
                 "frames": tuple[()] | None}
STRICT = msgspec.defstruct("FrEntry", [(f.name, _STRICT_TYPES.get(f.name, _I64 | None),
                                        msgspec.UNSET if f.required or f.name == "record_id" else None)
                                       for f in FIELDS], gc=False)
_STRICT_ENTRIES = msgspec.json.Decoder(list[STRICT])
_TOP_LEVEL = msgspec.json.Decoder(dict[str, msgspec.Raw])


def strict_json(data: bytes) -> tuple[dict, list] | None:
    """(The dump's top-level raw values, its entries as STRICT records) of a JSON dump written as torch writes
    it; None otherwise (the caller parses it into dicts)."""
    try:
        top = _TOP_LEVEL.decode(data)
        raw = top.pop("entries", None)
        return (top, _STRICT_ENTRIES.decode(raw)) if raw is not None else None
    except (msgspec.DecodeError, ValueError, RecursionError, MemoryError):  # ValueError: bad UTF-8
        return None


def read_strict(recs: list, interner: Interner) -> tuple:
    """read_entries' parts of STRICT records (where one cannot be read: ValueError, the caller reads dicts)."""
    try:
        return _read(recs, interner, typed=True)
    except (*READ_ERRORS, RecursionError) as exc:
        raise ValueError(str(exc)) from None


def _codes(keys: list[list], n: int) -> np.ndarray:
    """Each entry's row, numbered first seen first, from the keys of its row fields."""
    position = collections.defaultdict(itertools.count().__next__)
    return np.fromiter(map(position.__getitem__, zip(*keys)), np.intp, n)


_ATOMS = {str, int, bool, type(None), float}


def _keys(values: list) -> list:
    """A hashable key per value (where a list inside a list makes one unhashable, the caller keys them one by
    one), equal where the values are equal, lists and tuples alike, as the interner's keys."""
    kinds = set(map(type, values))
    if kinds <= _ATOMS:
        return values
    if kinds == {list} and set(map(len, values)) == {1}:  # one tensor per call: the common case, in C passes
        firsts = list(map(operator.itemgetter(0), values))
        kinds = set(map(type, firsts))
        if kinds <= _ATOMS:
            return firsts
        if kinds == {list}:
            return list(map(tuple, firsts))
    elif kinds == {list} and set(map(len, values)) == {2}:  # (a process group: [name, desc])
        return list(map(tuple, values))
    return list(map(_key, values))


def _key(value, depth: int = 0):
    if value.__class__ in _ATOMS:
        return value
    if depth > _MAX_DEPTH:  # (a list that contains itself, from a damaged pickle: a key of its own)
        return _OTHER, next(_FRESH)
    if isinstance(value, (list, tuple)):
        return (_SEQ, *(_key(v, depth + 1) for v in value))
    if isinstance(value, dict):
        return (_DICT, *((_key(k, depth + 1), _key(v, depth + 1)) for k, v in value.items()))
    try:
        hash(value)
        return value
    except TypeError:  # (a set, say: a key of its own, read by interpret as it is)
        return _OTHER, next(_FRESH)


_MAX_DEPTH = 32  # no row field of a dump nests deeper than 3
_SEQ, _DICT, _OTHER = object(), object(), object()  # tag keys of sequences, dicts, unhashable values
_FRESH = itertools.count()


def own_values(f, values: list, p2p: np.ndarray):
    """An INT field of every entry: (int64, unknown mask), or float64 seconds with NaN for unknown."""
    n = len(values)
    if _MISSING in values:
        values = [(i if f.required else None) if v is _MISSING else v for i, v in enumerate(values)]
    got = int_arrays(values) if set(map(type, values)) <= _FAST[f.required] else None
    if got is None:  # a value of another type, or beyond int64: converted one by one, refused where it is read
        if f.seconds:
            values = [v if v else None for v in values]  # 0 (or anything false) is unknown
        skip = p2p if f.only == "collective" else ~p2p if f.only == "p2p" else np.zeros(n, bool)
        got = int_arrays([None if s else _int(f, v, i) for i, (v, s) in enumerate(zip(values, skip.tolist()))])
    ints, unknown = got
    if f.only is not None:
        unknown = unknown | (p2p if f.only == "collective" else ~p2p)
    if f.seconds:  # 0 is unknown too; int(v) / 1e9 is the same IEEE arithmetic in numpy
        return np.where(unknown | (ints == 0), np.nan, ints / 1e9)
    return ints, unknown


_FAST = {True: {int}, False: {int, type(None)}}  # the types an INT field is read in one C pass from


def _int(f, value, i: int):
    if value is None and f.required:
        raise EntryError(f.name, TypeError("None is not an integer"), i)
    if value is None:
        return None
    try:
        got = int(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise EntryError(f.name, exc, i) from None
    if not INT64[0] <= got <= INT64[1]:
        raise EntryError(f.name, ValueError(f"{got} is beyond a 64-bit integer"), i)
    return got


def _at(exc: EntryError, i: int) -> EntryError:
    exc.at = i
    return exc


def frames_of(values: list, interner: Interner) -> tuple[list | None, np.ndarray | None]:
    """(Each distinct stack as the interner's frame list, each entry's) of every entry's raw frames, keyed in C
    passes; (None, None) when no entry has frames."""
    if not any(values):
        return None, None
    if not all(values):
        values = [raw or () for raw in values]  # (no frames: the empty key)
    stacks, codes = stacks_of(values, lambda raw: tuple(map(FRAME_KEY, raw)))
    if stacks is None:
        return None, None
    return [interner.frame_list(raw) if raw else interner.empty_frames for raw in stacks], codes


def from_rows(rows: list[tuple], interner: Interner) -> tuple[list[tuple], np.ndarray]:
    """read_rows on the distinct raw rows a C reader found (each a dict of the row fields): its rows, and which
    one each raw row is (raw rows that differ only where the model does not look become one, as in read_rows)."""
    columns = {name: [r.get(name) for r in rows] for name in ROW_FIELDS}
    return read_rows(rows, columns, interner)


__all__ = ["Interner", "read_entries", "read_strict", "strict_json", "from_rows", "frames_of"]
