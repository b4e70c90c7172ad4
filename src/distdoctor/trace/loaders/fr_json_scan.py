"""Flight Recorder JSON dumps read by a compiled scanner, with no Python object per entry.

A thousand-rank job leaves two million entries. Decoding each into Python objects costs several microseconds,
most of it on the fields that repeat (group, op name, sizes, dtypes, state, thread): a dump holds a handful of
distinct combinations of them. Here one compiled pass walks the `entries` array, parses the fields that differ
per entry (fr_schema's INT fields) into arrays and notes where each row field's value lies; entries are then
grouped by the exact bytes of those values (an entry that repeats an earlier one's bytes but for its integers is
recognised by replaying them, see _fr_json_kernel.c: replay), and one representative entry of each group is
parsed and read by the Python reader's row code (fr_reader.from_rows). Entries of a group differ from their
representative only in the integers, so both readers give the same values.

The pass is in C (_fr_json_kernel.c, built when distdoctor is installed, where a C compiler is found; the
wheels carry it built). It validates the whole file as JSON, as msgspec does when it skips a value. Anything this
reader does not expect (a backslash in a string, a key twice, non-empty stack frames, an integer field holding a
float, a negative or a string) makes it return None, and the per-entry reader takes the file; so does every
file when the scanner was not built."""

from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass
import numpy as np

from distdoctor.trace.loaders.fr_schema import INT_FIELDS, kernel_names

# The kernel's field numbering (fr_schema): the integers it parses first, then the fields whose bytes it spans.
_FIELDS = kernel_names("json")
OWN_INT_FIELDS = tuple(f.name for f in INT_FIELDS)
N_SPANNED = len(_FIELDS) - len(OWN_INT_FIELDS)


def name_table(names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Field names as the compiled kernels compare them: one zero-padded row of bytes per name, and the lengths."""
    table = np.zeros((len(names), max(map(len, names))), np.uint8)
    for k, name in enumerate(names):
        table[k, :len(name)] = np.frombuffer(name.encode(), np.uint8)
    return table, np.array([len(name) for name in names], np.int64)


_NAMES, _NAME_LEN = name_table(_FIELDS)

STACK_DEPTH = 256  # the validator's open containers: deeper nesting is refused, as by msgspec
FAIL_CAPACITY = -4


@dataclass
class ScannedDump:
    header: bytes  # the document with its entries cut out (an empty list in their place)
    n: int
    groups: np.ndarray  # entry -> index into `representatives`
    representatives: list[bytes]  # one entry's JSON text per group of equal row-field bytes
    ints: tuple[dict, dict]  # (field -> int64 values, field -> whether the entry wrote an integer: not null or absent)


@functools.lru_cache(maxsize=1)
def kernels():
    """The compiled scanner built when distdoctor was installed (_fr_json_kernel.c), None where it is missing or
    cannot start (see compiled). Call before forking workers so they inherit it."""
    global FAILURE
    module, FAILURE = compiled("_fr_json_kernel", lambda m: _scan_with(m.scan, _WARM_UP) is not None)
    return None if module is None else module.scan


# Said once per process on stderr where the C readers were not built (an install without a C compiler).
MISSING_NOTE = ("distdoctor: note: the compiled Flight Recorder readers were not built (no C compiler at install); "
                "dumps are read in Python, with about 4x the CPU time (1024 ranks x 2000 entries of JSON: ~15 s "
                "instead of ~3.5 s). Install a wheel, or reinstall where a C compiler is found, to get them.")
_noted_missing = False


def compiled(name: str, reads_right) -> tuple[object | None, str | None]:
    """(The C module `name` (in trace/loaders) when it imports and `reads_right` a known dump, else None; why one
    that imported could not run, for the CLI to say). DISTDOCTOR_SCANNER=off in the environment: none (the tests
    and benchmarks compare the Python reader with it). A module missing is said once on stderr (MISSING_NOTE)."""
    global _noted_missing
    if os.environ.get("DISTDOCTOR_SCANNER", "").lower() in ("off", "0"):
        return None, None
    try:
        module = importlib.import_module(f"distdoctor.trace.loaders.{name}")
    except ImportError:  # not built: no C compiler at install
        if not _noted_missing:
            _noted_missing = True
            print(MISSING_NOTE, file=sys.stderr)
        return None, None
    try:
        if not reads_right(module):
            raise RuntimeError("it misread a known dump")
    except Exception as exc:  # it cannot run here: the Python reader, which the CLI names
        return None, startup_failure(exc)
    return module, None


def startup_failure(exc: Exception) -> str:
    """Why a compiled kernel could not start, in one line (the CLI's note; also fr_pickle_scan's)."""
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


FAILURE: str | None = None  # why the compiled scanner is there but could not start (for the CLI to say)


_WARM_UP = b'{"version": "2.10", "entries": [{"record_id": 0, "process_group": ["0", ""], "profiling_name": "x"}]}'



def scan_fr_json(data: bytes) -> ScannedDump | None:
    """The dump's header, its entries grouped by their repeating fields, and its per-entry integers; None when
    the file is not laid out as this reader expects or the scanner was not built (see the module docstring)."""
    scan = kernels()
    if scan is None or not _utf8(data):
        return None  # (text that is not UTF-8 is the per-entry reader's to refuse, as it does any corrupt dump)
    return _scan_with(scan, data)


def _utf8(data: bytes) -> bool:
    """The bytes are UTF-8 text (the scanner skips strings it does not read, and would not see a damaged one)."""
    if data.isascii():
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _scan_with(scan, data: bytes) -> ScannedDump | None:
    buf = np.frombuffer(data, np.uint8)
    n_own, n_shared = len(OWN_INT_FIELDS), N_SPANNED
    capacity = len(data) // 256 + 16  # Flight Recorder entries take 300 bytes or more; else counted below
    for _ in range(2):
        bounds = np.empty((capacity, 2), np.int64)
        own = np.zeros((capacity, n_own), np.int64)
        state = np.empty((capacity, n_own), np.uint8)  # 0 absent, 1 integer, 2 null
        spans = np.empty((capacity, n_shared, 2), np.int64)
        groups = np.empty(capacity, np.int64)
        region = np.zeros(2, np.int64)
        table = np.full(2 * MAX_GROUPS, -1, np.int64)
        group_digest = np.empty(MAX_GROUPS, np.uint64)
        first = np.empty(MAX_GROUPS, np.int64)
        n_groups = np.zeros(1, np.int64)
        # Scratch space per call, none shared: the kernel releases the GIL, so two threads may scan at once.
        stack = np.empty(STACK_DEPTH, np.uint8)
        programs = np.empty((MAX_PROGRAMS, MAX_OPS, 3), np.int64)  # (untouched pages cost nothing)
        prog_len = np.zeros(MAX_PROGRAMS, np.int64)
        ops = np.empty((MAX_OPS, 3), np.int64)
        successor = np.full(MAX_GROUPS, -1, np.int64)
        n = scan(buf, _NAMES, _NAME_LEN, _SLOTS, _MIX, bounds, own, state, spans, stack, region, groups, table,
                 group_digest, first, n_groups, programs, prog_len, ops, successor)
        if n != FAIL_CAPACITY or n_groups[0] >= MAX_GROUPS:
            break
        capacity = int(np.count_nonzero(buf == ord("{"))) + 1
    if n < 0:
        return None  # including more than MAX_GROUPS distinct rows: the per-entry reader
    start, end = region.tolist()
    if n and (state[:n, 0] == 2).any():
        return None  # a null record_id: the Python reader refuses it, naming the entry
    header = data[:start] + b"[]" + data[end:]  # the rest of the document (small): version, pg_config, rank...
    representatives = [data[s:e] for s, e in bounds[first[:n_groups[0]]].tolist()]
    ints = ({name: own[:n, k] for k, name in enumerate(OWN_INT_FIELDS)},
            {name: state[:n, k] == 1 for k, name in enumerate(OWN_INT_FIELDS)})
    return ScannedDump(header, n, groups[:n], representatives, ints)


def _collision_free_slots(names: tuple[str, ...], size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """A table from (length * a + first byte * b + last byte) % size to the field, with no two names on one
    slot (_fr_json_kernel.c: field_of)."""
    for a in range(1, size):
        for b in range(1, size):
            slots = np.full(size, -1, np.int64)
            for k, name in enumerate(names):
                raw = name.encode()
                at = (len(raw) * a + raw[0] * b + raw[-1]) % size
                if slots[at] >= 0:
                    break
                slots[at] = k
            else:
                return slots, np.array([a, b], np.int64)
    raise AssertionError("no collision-free table for the field names")  # cannot happen for these names


_SLOTS, _MIX = _collision_free_slots(_FIELDS)
MAX_GROUPS = 4096  # distinct combinations of repeating fields in one dump; beyond, the per-entry reader
MAX_PROGRAMS = 512  # groups whose later entries are replayed (_fr_json_kernel.c: replay); the others are scanned
MAX_OPS = 64  # ops of one replay program (a Flight Recorder entry needs about 20)
