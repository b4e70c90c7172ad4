"""Flight Recorder pickles read by a compiled opcode reader, with no Python object per entry.

A 16 384-rank set of pickles holds 33 million entries. CPython's unpickler builds each one's dict, its lists and
its frame dicts (10 ms or so per 2000-entry dump), only for the Python reader (fr_reader.py) to key them back
into a few distinct rows. Here one compiled pass (_fr_pickle_kernel.c) executes the opcodes into a table of
nodes, gives every value under the entries an id (equal kind and content, equal id), and groups the entries by
the ids of their repeating fields; only one entry of each group, the dump's header and each distinct stack are
built as Python objects, from the nodes, as the unpickler would build them. fr_reader.from_rows then keys
those rows exactly as it keys the unpickled entries: both readers give the same trace.

Nothing in the file is called or looked up: only builtin scalars and containers are read, and anything else
(a global, an opcode not written for builtin values, a memo slot never filled, bad UTF-8, a container that
contains itself, a file over MAX_BYTES) returns None and the safe unpickler takes the file (its reason, if it
refuses it too, is the one the user sees). The reader is in C (_fr_pickle_kernel.c, built when distdoctor is
installed, where a C compiler is found; the wheels carry it built); without it, it returns None."""

from __future__ import annotations

import functools
import pickle
import struct
import threading
from dataclasses import dataclass

import numpy as np

from distdoctor.trace.loaders.fr_json_scan import compiled, name_table
from distdoctor.trace.loaders.fr_schema import INT_FIELDS, ROW_FIELDS, kernel_names

# The fields read, in the order _fr_pickle_kernel.c's entry_codes takes them (fr_schema): the row fields, the
# stack, then the integers.
_FIELDS = kernel_names("pickle")
_NAMES, _NAME_LEN = name_table(_FIELDS)
INT_OK, INT_NONE, INT_OTHER = 0, 1, 2  # how the kernel found an integer field: an int, None or absent, else

# Larger files go to the unpickler: the node table reserves about 80 bytes per byte of the file.
MAX_BYTES = 64 << 20


@dataclass
class ScannedPickle:
    header: dict  # the dump's top-level dict, its entries left out (an empty list in their place)
    rows: list[tuple]  # the raw repeating fields of each distinct row, in first-seen order
    codes: np.ndarray  # entry -> row
    ints: np.ndarray  # (entries, INT_FIELDS): int64 values, 0 where None or missing
    int_state: np.ndarray  # INT_OK / INT_NONE / INT_OTHER
    stacks: list  # each distinct raw `frames` value, in first-seen order
    stack_codes: np.ndarray  # entry -> index into stacks

    def ints_by_field(self) -> tuple[dict, dict | None]:
        """(field -> int64 values, field -> whether the entry wrote an integer there); (.., None) where a value is
        of another type, or a required one (record_id) is None or absent: the Python reader words those."""
        state = self.int_state
        required = [j for j, f in enumerate(INT_FIELDS) if f.required]
        if (state == INT_OTHER).any() or (state[:, required] != INT_OK).any():
            return {}, None
        return ({f.name: self.ints[:, j] for j, f in enumerate(INT_FIELDS)},
                {f.name: state[:, j] == INT_OK for j, f in enumerate(INT_FIELDS)})


@functools.lru_cache(maxsize=1)
def kernels():
    """The compiled module built when distdoctor was installed (_fr_pickle_kernel.c), None where it is missing or
    cannot start (see fr_json_scan.compiled). Call before forking workers so they inherit it."""
    global FAILURE
    warm = pickle.dumps({"version": "2.10", "entries": [{"record_id": 0, "frames": []}]}, protocol=4)
    module, FAILURE = compiled("_fr_pickle_kernel", lambda m: _scan_with(m, warm) is not None)
    return module


FAILURE: str | None = None  # why a compiled opcode reader is there but could not start (for the CLI to say)


def scan_fr_pickle(data: bytes) -> ScannedPickle | None:
    """The dump read in compact form; None where the safe unpickler must read it (see the module docstring)."""
    k = kernels()
    if k is None or len(data) > MAX_BYTES:
        return None
    try:
        return _scan_with(k, data)
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError, MemoryError,
            UnicodeDecodeError):
        return None


def _scan_with(k, data: bytes) -> ScannedPickle | None:
    buf = np.frombuffer(data, np.uint8)
    cap = len(data) + 1  # an opcode makes at most one node, one edge, one stack slot
    room = _scratch()
    kinds = room.take("kinds", cap + 1, np.int8)
    ival, ival2, head, tail = (room.take(name, cap + 1, np.int64) for name in ("ival", "ival2", "head", "tail"))
    child, nxt, stack, marks = (room.take(name, cap, np.int64) for name in ("child", "nxt", "stack", "marks"))
    memo = room.take("memo", cap, np.int64)
    root = np.zeros(2, np.int64)
    nn = k.run(buf, kinds, ival, ival2, head, tail, child, nxt, stack, marks, memo, root)
    memo[:root[1]] = 0  # the slots written (counted as they are, a failed run too): zero for the next dump
    if nn < 0:
        return None
    nodes = _Nodes(k, data, kinds, ival, ival2, head, child, nxt)
    top = int(root[0])
    if kinds[top] != k.DICT:
        return None
    header: dict = {}
    entries = None
    for key, value in nodes.pairs(top):
        name = nodes.build(key)
        if name == "entries":
            entries = value
            header[name] = []
        else:
            header[name] = nodes.build(value)
    if entries is None or kinds[entries] != k.LIST or head[entries] < 0:
        return None  # no entries: the general path (cheap) reads the header and says what is missing
    n = k.count_items(entries, head, nxt)
    n_shared = len(ROW_FIELDS)
    vid = room.take("vid", nn, np.int64, fill=-1)
    table = room.take("table", _pow2(2 * nn), np.int64, fill=-1)
    rep = room.take("rep", nn, np.int64)
    key_field = room.take("key_field", nn, np.int64, fill=-2)
    n_ids = np.zeros(1, np.int64)
    fields = np.empty((n, len(_FIELDS)), np.int64)
    row_table = np.full(_pow2(2 * n), -1, np.int64)
    row_ids = np.empty((n, n_shared), np.int64)
    row_first = np.empty(n, np.int64)
    codes = np.empty(n, np.intp)
    frames_id = np.empty(n, np.int64)
    ints = np.empty((n, len(INT_FIELDS)), np.int64)
    int_state = np.empty((n, len(INT_FIELDS)), np.int8)
    rows = k.entry_codes(entries, buf, kinds, ival, ival2, head, child, nxt, _NAMES, _NAME_LEN, n_shared, vid, table,
                         rep, n_ids, stack, key_field, fields, row_table, row_ids, row_first, codes, frames_id,
                         ints, int_state)
    if rows < 0:
        return None
    raw_rows = [tuple(map(nodes.build, fields[e, :n_shared].tolist())) for e in row_first[:rows].tolist()]
    distinct, first, stack_codes = np.unique(frames_id, return_index=True, return_inverse=True)
    order = np.argsort(first)  # stacks numbered first seen first
    renumber = np.empty_like(order)
    renumber[order] = np.arange(len(order))
    stacks = [nodes.build(int(rep[v])) for v in distinct[order].tolist()]
    return ScannedPickle(header, raw_rows, codes, ints, int_state, stacks,
                         renumber[stack_codes.reshape(-1)].astype(np.intp))


class _Scratch:
    """Arrays kept from one dump to the next: a dump's node table is tens of megabytes of fresh pages
    otherwise, and first touching them costs more than the scan. `take` gives a view of `size` items, filled
    with `fill` when given; new arrays are zeros (the memo is kept zeroed by its user instead of filled)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def take(self, name: str, size: int, dtype, fill=None) -> np.ndarray:
        got = self.arrays.get(name)
        if got is None or len(got) < size:
            got = self.arrays[name] = np.zeros(max(size, len(got) * 3 // 2 if got is not None else 0), dtype)
        view = got[:size]
        if fill is not None:
            view.fill(fill)
        return view


_local = threading.local()  # one scratch per thread: the kernels release the GIL


def _scratch() -> _Scratch:
    room = getattr(_local, "room", None)
    if room is None:
        room = _local.room = _Scratch()
    return room


def _pow2(n: int) -> int:
    return 1 << max(4, (n - 1).bit_length())


_DOUBLE = struct.Struct(">d")


class _Nodes:
    """Python values of nodes, built as the unpickler builds them (a node reached twice is one object)."""

    def __init__(self, k, data: bytes, kinds, ival, ival2, head, child, nxt) -> None:
        self.data, self.kinds, self.ival, self.ival2 = data, kinds, ival, ival2
        self.head, self.child, self.nxt = head, child, nxt
        self.k = k
        self.built: dict[int, object] = {}

    def items(self, node: int):
        e = int(self.head[node])
        while e >= 0:
            yield int(self.child[e])
            e = int(self.nxt[e])

    def pairs(self, node: int):
        items = self.items(node)
        return zip(items, items)

    def build(self, node: int):
        got = self.built.get(node, self)
        if got is not self:
            return got
        k, kind = self.k, int(self.kinds[node])
        if kind == k.NONE:
            value = None
        elif kind in (k.TRUE, k.FALSE):
            value = kind == k.TRUE
        elif kind == k.INT:
            value = int(self.ival[node])
        elif kind == k.BIG:
            value = int.from_bytes(self.data[self.ival[node]:self.ival2[node]], "little", signed=True)
        elif kind == k.FLOAT:
            value = _DOUBLE.unpack_from(self.data, int(self.ival2[node]))[0]
        elif kind == k.STR:
            value = self.data[self.ival[node]:self.ival2[node]].decode("utf-8", "surrogatepass")
        elif kind == k.LIST:
            value = [self.build(c) for c in self.items(node)]
        elif kind == k.TUPLE:
            value = tuple(self.build(c) for c in self.items(node))
        else:
            value = {}
            for key, item in self.pairs(node):
                value[self.build(key)] = self.build(item)
        self.built[node] = value
        return value
