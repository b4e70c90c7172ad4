"""PyTorch Flight Recorder dumps (versions 2.x, NCCL and Gloo styles) -> RankTrace.

Two physical forms carry the same dict:
- pickle: what `torch._C._distributed_c10d._dump_fr_trace` / `_dump_nccl_trace` return and what
  `TORCH_FR_DUMP_TEMP_FILE<rank>` holds. A dump is untrusted input, so it is read with `SafeUnpickler`
  (safe_pickle.py), which builds only builtin containers and scalars and refuses every global.
- JSON: `_dump_fr_trace_json` (no stack frames; `time_discovered_*` are 0 instead of None; pg_status values
  are strings).

Fields read (torch/csrc/distributed/c10d/FlightRecorder*.cpp, flight_recorder/components/*.py):
top level `version`, `pg_config` {name: {name, desc, ranks: "[0, 1]"}}, `entries`; per entry `record_id`,
`process_group` (name, desc), `collective_seq_id`, `p2p_seq_id`, `is_p2p`, `profiling_name` ("nccl:all_reduce",
"nccl:send 0->1", "nccl:recv 1<-0", group-local ranks), `input_sizes`/`output_sizes`/`*_dtypes`, `state`
(scheduled/started/completed), `retired`, `time_created_ns`, `time_discovered_{started,completed}_ns`,
`thread_name`, `frames`.

Quirks handled here (checked on torch 2.13 Gloo dumps): the default group is `''` in pg_config but `'0'` in
entries; pg_config may list no members (membership is then inferred across the trace set, see
loaders/__init__.py); Gloo entries stay `scheduled` and signal completion only by `retired`; Gloo records no
p2p. FR does not record broadcast/reduce roots, so `root` stays None.
"""

from __future__ import annotations

import collections
import functools
import itertools
import json
import operator
import re
from typing import Any

import msgspec
import numpy as np

from distdoctor.collectives import canonical_dtype, canonical_op
from distdoctor.trace.loaders.fr_coded import FRAME_KEY, READ_ERRORS, coded_parts, parts_from_scan
from distdoctor.trace.loaders.fr_columns import entry_columns
from distdoctor.trace.loaders.fr_json_scan import ScannedDump, scan_fr_json
from distdoctor.trace.loaders.fr_pickle_scan import scan_fr_pickle
from distdoctor.trace.loaders.safe_pickle import PICKLE_ALLOWED, SafeUnpickler, safe_unpickle  # noqa: F401 (API)
from distdoctor.trace.coded import DUMP_FIELDS, CodedEntries
from distdoctor.trace.model import DEFAULT_GROUP, EntryColumns, Frame, GroupInfo, RankTrace

_P2P_META = re.compile(r"^\s*(\d+)\s*(->|<-)\s*(\d+)\s*$")
_RANK_SUFFIX = re.compile(r"(\d+)(?:\.[A-Za-z]+)*$")  # rank_3, dump_3.pkl, rank_3.fr.pkl


def rank_from_filename(path: str) -> int | None:
    """`nccl_trace_rank_3`, `dump_3.pkl`, `rank_3.fr.pkl` -> 3 (the last number before the extensions)."""
    m = _RANK_SUFFIX.search(path.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


# Keys only a Flight Recorder dump has besides `version`: a rank that recorded nothing writes JSON without
# `entries` (torch 2.13's _dump_fr_trace_json leaves the key out), which is still that rank's (empty) trace.
_FR_KEYS = ("entries", "pg_config", "pg_status")


def looks_like_fr(obj: object) -> bool:
    return isinstance(obj, dict) and "version" in obj and any(k in obj for k in _FR_KEYS)


def _parse_ranks(raw: object) -> list[int]:
    if isinstance(raw, str):
        return list(_parse_rank_text(raw))  # every rank's dump repeats the same member lists
    return _parse_rank_list(raw)


@functools.lru_cache(maxsize=256)
def _parse_rank_text(text: str) -> tuple[int, ...]:
    return tuple(_parse_rank_list(json.loads(text) if text.strip() else []))


def _parse_rank_list(raw: object) -> list[int]:
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"pg_config ranks is {type(raw).__name__}, not a list")
    return sorted(int(r) for r in raw)


class _Interner:
    """Shares equal size/dtype lists between entries: a dump repeats a few shapes thousands of times."""

    def __init__(self) -> None:
        self.sizes: dict[tuple, list] = {}
        self.strs: dict[tuple, list] = {}
        self.empty_frames: list[Frame] = []
        self.names: dict[str, tuple] = {}
        self.groups: dict = {}
        self.strings: dict = {}
        self.frames: dict = {}

    def frame_list(self, raw: list) -> list[Frame]:
        """One shared list per distinct call stack (a dump repeats a few stacks thousands of times; entries are
        read-only). Flight Recorder lists frames innermost first; the model (like a traceback) innermost last."""
        key = tuple(map(FRAME_KEY, raw))
        try:
            got = self.frames.get(key)
        except TypeError:  # an unhashable name or line (a damaged dump): built as it is, not shared
            return [Frame(str(f["name"]), str(f["filename"]), int(f["line"])) for f in reversed(raw)]
        if got is None:
            got = self.frames[key] = [Frame(str(f["name"]), str(f["filename"]), int(f["line"])) for f in reversed(raw)]
        return got

    def text(self, raw) -> str | None:
        """One shared object per distinct short string (thread names repeat on every entry)."""
        if not raw:
            return None
        got = self.strings.get(raw)
        if got is None:
            got = self.strings[raw] = str(raw)
        return got

    def group(self, raw) -> str:
        name = str(raw) or DEFAULT_GROUP  # Gloo's default group: '' in pg_config, '0' in entries
        self.groups[raw] = name
        return name

    def size_list(self, raw) -> list[list[int]]:
        if not raw:
            return []
        # Key without building a tuple per shape for the common one-tensor case (the key must not collide:
        # a one-shape key is the shape tuple, a many-shape key is a tuple of tuples; the two cannot be equal).
        key = tuple(raw[0]) if len(raw) == 1 else tuple(map(tuple, raw))
        got = self.sizes.get(key)
        if got is None:
            got = self.sizes[key] = [[int(d) for d in s] for s in raw]
        return got

    def str_list(self, raw) -> list[str]:
        if not raw:
            return []
        key = raw[0] if len(raw) == 1 else tuple(raw)
        got = self.strs.get(key)
        if got is None:
            got = self.strs[key] = [canonical_dtype(str(s)) for s in raw]  # "Float" -> "float32", as every loader
        return got


def _new_trace(version: object, rank: object, pg_config: object, path: str, source: str) -> RankTrace:
    """The dump's header: version, rank (the dump's own, else the file name's), group configuration."""
    version = str(version)
    if not version.startswith("2."):
        raise ValueError(f"unsupported Flight Recorder version {version!r} (2.x is supported)")
    rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else rank_from_filename(path)
    if rank is None:
        raise ValueError("cannot tell which rank this dump is from: name it with a rank suffix (e.g. rank_3)")
    trace = RankTrace(rank=rank, source=source, path=path, version=version)
    pg_config = pg_config or {}
    if not isinstance(pg_config, dict):
        raise ValueError(f"pg_config is {type(pg_config).__name__}, not a dict")
    for key, cfg in pg_config.items():
        if not isinstance(cfg, dict):
            raise ValueError(f"pg_config[{key!r}] is {type(cfg).__name__}, not a dict")
        name = str(cfg.get("name", key)) or DEFAULT_GROUP  # Gloo: the default group is '' here, '0' in entries
        try:
            members = _parse_ranks(cfg.get("ranks", []))
        except (ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"pg_config[{key!r}] ranks unreadable ({exc})") from None
        trace.groups[name] = GroupInfo(name=name, ranks=members, inferred=False, desc=str(cfg.get("desc", "")))
        if name == DEFAULT_GROUP and members:
            trace.world_size = len(members)
    return trace


def parse_fr_dump(obj: object, path: str, source: str, rank: int | None = None,
                  interner: _Interner | None = None) -> RankTrace:
    """Normalize one Flight Recorder dump dict. Raises ValueError(reason)."""
    if not looks_like_fr(obj):
        raise ValueError("not a Flight Recorder dump (no 'version' with 'entries' or 'pg_config')")
    trace = _new_trace(obj["version"], obj.get("rank") if rank is None else rank, obj.get("pg_config"), path, source)
    interner = interner or _Interner()
    entries = obj.get("entries", [])
    if not isinstance(entries, list):
        raise ValueError(f"'entries' is {type(entries).__name__}, not a list")
    # In compact form (fr_coded.py), else field by field across all entries (fr_columns.py); row by row where
    # neither can read an entry, so a malformed one is named by its index.
    parts = coded_parts(entries, interner)
    if parts is not None:
        try:
            _fill_coded(trace, interner, *parts)
            return trace
        except READ_ERRORS:
            pass  # a row the interner cannot read (a corrupt size): the readers below name its entry
    columns, local_peers, firsts = entry_columns(entries, interner, _op_of, _STATES) or _read_rows(entries, interner)
    for group, pg in firsts:
        if group not in trace.groups:  # membership not given: the trace-set loader infers it from who issued
            trace.groups[group] = GroupInfo(group, [], True, str(pg[1]) if len(pg) > 1 else "")
    _set_peers(trace, columns, local_peers)
    trace.entries = EntryColumns(columns)
    return trace


def _read_rows(entries: list, interner: _Interner) -> tuple[list[list], list[tuple[int, int]], list[tuple]]:
    """entry_columns' result, read one entry at a time; raises ValueError naming the first malformed entry."""
    rows = []
    local_peers = []
    firsts: dict[str, list] = {}  # group -> its first entry's process_group
    for i, raw in enumerate(entries):
        try:
            values, local_peer = _parse_entry(raw, i, interner)
        except READ_ERRORS as exc:
            what = f"missing key {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise ValueError(f"entry {i} is malformed ({what})") from None
        rows.append(values)
        if local_peer is not None:
            local_peers.append((i, local_peer))
        firsts.setdefault(values[1], raw["process_group"])
    columns = [list(c) for c in zip(*rows)] if rows else [[] for _ in _ENTRY_FIELDS]
    return columns, local_peers, list(firsts.items())


def _set_peers(trace: RankTrace, columns: list[list], local_peers: list[tuple[int, int]]) -> None:
    groups, peers = columns[_GROUP], columns[_PEER]
    for i, local in local_peers:
        peers[i] = _global_peer(trace, groups[i], local)


# The Entry fields a Flight Recorder dump fills, in the model's field order (rows and columns are built in it).
_ENTRY_FIELDS = DUMP_FIELDS
_GROUP = _ENTRY_FIELDS.index("group")
_PEER = _ENTRY_FIELDS.index("peer")


def _op_of(profiling: str, interner: _Interner) -> tuple[str, bool, int | None, str]:
    got = interner.names.get(profiling)
    if got is None:
        name, _, meta = profiling.partition(" ")
        op = canonical_op(name) or f"other:{profiling}"
        local_peer = None
        if op in ("send", "recv") and meta:
            m = _P2P_META.match(meta)
            if m:  # "send 0->1" is src->dst and "recv 1<-0" is dst<-src: the peer is the number after the arrow
                local_peer = int(m.group(3))
        got = interner.names[profiling] = (op, op in ("send", "recv"), local_peer, str(profiling))
    return got


def _parse_entry(raw: dict, i: int, interner: _Interner) -> tuple[tuple, int | None]:
    """The values of one Entry, in `_ENTRY_FIELDS` order, and its group-local p2p peer if it names one."""
    # The hot loop of loading a pickle (millions of entries): helpers are inlined and every shared value (group
    # and op names, size/dtype lists, thread names) is looked up in the interner's dicts before anything is built.
    get = raw.get
    group = raw["process_group"][0]
    group = interner.groups.get(group) or interner.group(group)
    named = interner.names.get(raw["profiling_name"]) or _op_of(raw["profiling_name"], interner)
    op, p2p_name, local_peer, profiling = named  # one shared string per name
    is_p2p = p2p_name or bool(get("is_p2p"))
    state = "completed" if get("retired") else _STATES.get(get("state"), "issued")
    frames_raw = get("frames")
    frames = interner.frame_list(frames_raw) if frames_raw else interner.empty_frames
    seq = None if is_p2p else get("collective_seq_id")
    p2p_seq = get("p2p_seq_id") if is_p2p else None
    created = get("time_created_ns")
    started = get("time_discovered_started_ns")
    completed = get("time_discovered_completed_ns")
    # One-element lists (the common case) are keyed by their element, longer ones by a tuple of tuples (resp.
    # a tuple of strings): the two key shapes cannot collide. Anything else goes through the interner's helpers.
    sizes, strs, size_list, str_list = interner.sizes, interner.strs, interner.size_list, interner.str_list
    v = get("input_sizes")
    in_sizes = (sizes.get(tuple(v[0])) if v.__class__ is list and len(v) == 1 else None) or size_list(v)
    v = get("output_sizes")
    out_sizes = (sizes.get(tuple(v[0])) if v.__class__ is list and len(v) == 1 else None) or size_list(v)
    v = get("input_dtypes")
    in_dtypes = (strs.get(v[0]) if v.__class__ is list and len(v) == 1 else None) or str_list(v)
    v = get("output_dtypes")
    out_dtypes = (strs.get(v[0]) if v.__class__ is list and len(v) == 1 else None) or str_list(v)
    thread = get("thread_name")
    if thread:
        thread = interner.strings.get(thread) or interner.text(thread)
    values = (
        int(get("record_id", i)), group, op,
        None if seq is None else int(seq),
        None if p2p_seq is None else int(p2p_seq),
        profiling, in_sizes, out_sizes, in_dtypes, out_dtypes,
        None, None, None, state,
        int(created) / 1e9 if created else None, int(started) / 1e9 if started else None,
        int(completed) / 1e9 if completed else None, None,
        thread or None, frames,
    )
    return values, local_peer


_STATES = {"completed": "completed", "started": "started", "scheduled": "issued"}


# ---- fast path for JSON dumps ---------------------------------------------------------------------------------
# A thousand-rank job leaves over a gigabyte of JSON. msgspec decodes it straight into these typed records,
# skipping the fields distdoctor does not read (instead of building a dict per entry), and the columns are then
# built field by field. The types are strict: any dump that does not fit them exactly (a null record_id, a float
# time, a string sequence number...) goes through the general path above, which accepts what it can and names
# what it cannot. So both paths give the same trace for every dump the fast one accepts.

class _FrFrame(msgspec.Struct, gc=False):
    name: str
    filename: str
    line: int


class _FrEntry(msgspec.Struct, gc=False):
    process_group: tuple[str, ...]  # (name, desc)
    profiling_name: str
    record_id: int | msgspec.UnsetType = msgspec.UNSET
    collective_seq_id: int | None = None
    p2p_seq_id: int | None = None
    is_p2p: bool | None = None
    # Tuples, not lists: hashable, so equal values are found in a table (see parse_fr_json_fast).
    input_sizes: tuple[tuple[int, ...], ...] | None = None
    output_sizes: tuple[tuple[int, ...], ...] | None = None
    input_dtypes: tuple[str, ...] | None = None
    output_dtypes: tuple[str, ...] | None = None
    state: str | None = None
    retired: bool | None = None
    time_created_ns: int | None = None
    time_discovered_started_ns: int | None = None
    time_discovered_completed_ns: int | None = None
    thread_name: str | None = None
    frames: list[_FrFrame] | None = None


class _FrDump(msgspec.Struct):
    version: str
    entries: list[_FrEntry]  # required here: a dump without entries takes the general path (looks_like_fr)
    pg_config: dict[str, dict[str, Any]] | None = None
    rank: Any = None


_FR_JSON = msgspec.json.Decoder(_FrDump)
_FR_ENTRY = msgspec.json.Decoder(_FrEntry)


# Per entry, the fields that repeat (a dump holds a handful of distinct combinations of them) and the fields
# that do not. Each distinct combination is interpreted once; the rest are plain columns.
_read_shared = operator.attrgetter("process_group", "profiling_name", "input_sizes", "output_sizes",
                                   "input_dtypes", "output_dtypes", "state", "retired", "thread_name", "is_p2p")


def parse_fr_json_fast(data: bytes, path: str, interner: _Interner, scan: bool = True) -> RankTrace | None:
    """A JSON dump decoded straight into columns; None when it does not fit the strict types (the caller then
    takes the general path, which also words the error when there is one). Read by the compiled scanner when it
    can (`scan` False: never, the tests' oracle), else entry by entry: both give the same trace."""
    scanned = scan_fr_json(data) if scan else None
    if scanned is not None:
        trace = _trace_from_scan(scanned, path, interner)
        if trace is not None:
            return trace
    return _trace_from_entries(data, path, interner)


def _trace_from_scan(scanned: ScannedDump, path: str, interner: _Interner) -> RankTrace | None:
    try:
        recs = [_FR_ENTRY.decode(text) for text in scanned.representatives]
    except (msgspec.DecodeError, ValueError, RecursionError, MemoryError):  # ValueError: bad UTF-8
        return None
    if any(rec.frames for rec in recs):
        return None  # the per-entry reader builds the frames
    ints = scanned.ints
    record_id, absent = ints["record_id"]  # null is refused by the scan: unknown means absent
    index = np.where(absent, np.arange(scanned.n), record_id)  # absent: the entry's position, as per entry
    times = [np.where(ints[name][1] | (ints[name][0] == 0), np.nan, ints[name][0] / 1e9)
             for name in ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")]
    return _assemble(scanned.version, scanned.rank, scanned.pg_config, path, interner,
                     [_read_shared(rec) for rec in recs], scanned.groups, index, ints["collective_seq_id"],
                     ints["p2p_seq_id"], times, None)


def _trace_from_entries(data: bytes, path: str, interner: _Interner) -> RankTrace | None:
    try:
        dump = _FR_JSON.decode(data)
    except (msgspec.DecodeError, ValueError, RecursionError, MemoryError):  # ValueError: bad UTF-8
        return None
    recs = dump.entries
    n = len(recs)
    # C loops only, per entry: one tuple of the repeating fields, hashed once (a missing key takes the next
    # code: rows are numbered first seen first), and each integer field straight into an array.
    position = collections.defaultdict(itertools.count().__next__)
    codes = np.fromiter(map(position.__getitem__, map(_read_shared, recs)), np.intp, n)
    record_id = _int_column(recs, "record_id")
    if record_id is None:  # absent somewhere (UNSET): the entry's position stands in, as in the general path
        index = [i if x is msgspec.UNSET else x for i, x in enumerate(map(_RECORD_ID, recs))]
    else:
        index = record_id[0]
    frames = None
    if any(map(_FRAMES, recs)):
        frames = [[Frame(f.name, f.filename, f.line) for f in reversed(fs)] if fs else interner.empty_frames
                  for fs in map(_FRAMES, recs)]
    seq, p2p_seq = (_int_column(recs, name) or [getattr(rec, name) for rec in recs]
                    for name in ("collective_seq_id", "p2p_seq_id"))
    try:
        times = [_time_column(recs, name) for name in _TIME_FIELDS]
    except OverflowError:  # a time beyond any float (10**400): the general path names the entry
        return None
    return _assemble(dump.version, dump.rank, dump.pg_config, path, interner, list(position), codes, index,
                     seq, p2p_seq, times, frames)


_RECORD_ID = operator.attrgetter("record_id")
_FRAMES = operator.attrgetter("frames")
_TIME_FIELDS = ("time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns")


def _int_column(recs: list, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(int64 values, unknown mask) of an integer field, as the scanner gives it; None when some entry has no
    value (None, UNSET) or one beyond int64 (a corrupt dump: Python's ints have no limit), for a Python list."""
    try:
        values = np.fromiter(map(operator.attrgetter(name), recs), np.int64, len(recs))
    except (TypeError, OverflowError, ValueError):
        return None
    return values, np.zeros(len(values), bool)


def _time_column(recs: list, name: str) -> np.ndarray | list:
    """Seconds as float64, NaN where unknown (0 or None), as the scanner gives them; a list with None when some
    value does not fit int64. numpy's int -> float -> / 1e9 is the same IEEE arithmetic as Python's `t / 1e9`."""
    got = _int_column(recs, name)
    if got is None:
        return [t / 1e9 if t else None for t in map(operator.attrgetter(name), recs)]
    ns = got[0]
    return np.where(ns == 0, np.nan, ns / 1e9)


def _assemble(version, rank, pg_config, path: str, interner: _Interner, keys: list[tuple], codes: np.ndarray,
              index, seq, p2p_seq, times: list, frames: list | None) -> RankTrace | None:
    """The trace from the distinct combinations of the entries' repeating fields (`keys`, each interpreted
    once), which one each entry has (`codes`), and the entries' own values, in entry order."""
    if not all(key[0] for key in keys):
        return None  # an empty process_group: the general path says which entry
    trace = _new_trace(version, rank, pg_config, path, "flight_recorder-json")
    _fill_coded(trace, interner, keys, codes, index, seq, p2p_seq, times, frames)
    return trace


def _fill_coded(trace: RankTrace, interner: _Interner, keys: list[tuple], codes: np.ndarray, index, seq, p2p_seq,
                times: list, frames: list | None) -> None:
    """`trace`'s entries in compact form (see _assemble); the trace is changed only once all is read."""
    table = [_interpret(key, interner) for key in keys]
    inferred = {}
    for key, row in zip(keys, table):  # groups pg_config does not list: membership is inferred later
        pg = key[0]
        if row[0] not in trace.groups and row[0] not in inferred:
            inferred[row[0]] = GroupInfo(row[0], [], True, str(pg[1]) if len(pg) > 1 else "")
    trace.groups.update(inferred)
    rows = [(*row[:9], _global_peer(trace, row[0], row[10])) for row in table]
    coded = CodedEntries(rows, [row[9] for row in table], codes, index, seq, p2p_seq, times, frames)
    trace.entries = EntryColumns(None, coded)


def _global_peer(trace: RankTrace, group: str, local: int | None) -> int | None:
    """Profiling names give p2p peers as group-local ranks; the model keeps global ranks."""
    if local is None:
        return None
    members = trace.groups[group].ranks
    if members and local < len(members):
        return members[local]
    return local if group == DEFAULT_GROUP else None  # default group: local rank == global rank


def _interpret(key: tuple, interner: _Interner) -> tuple:
    """The model's values for one distinct combination of an entry's repeating fields."""
    pg, profiling, in_sizes, out_sizes, in_dtypes, out_dtypes, state, retired, thread, is_p2p = key
    op, p2p_name, local_peer, profiling = interner.names.get(profiling) or _op_of(profiling, interner)
    return (interner.groups.get(pg[0]) or interner.group(pg[0]), op, profiling,
            interner.size_list(in_sizes), interner.size_list(out_sizes),
            interner.str_list(in_dtypes), interner.str_list(out_dtypes),
            "completed" if retired else _STATES.get(state, "issued"), interner.text(thread),
            p2p_name or bool(is_p2p), local_peer)


def load_fr_pickle(data: bytes, path: str, interner: _Interner | None = None, scan: bool = True) -> RankTrace:
    """A pickled dump read by the compiled opcode reader where it can (fr_pickle_scan; `scan` False: never, the
    tests' oracle), else unpickled safely and read as a dict. Both give the same trace."""
    interner = interner or _Interner()
    scanned = _from_scan(data, path, interner) if scan else None
    if scanned is not None:
        return scanned
    obj = safe_unpickle(data)
    return parse_fr_dump(obj, path, "flight_recorder-pickle", interner=interner)


def _from_scan(data: bytes, path: str, interner: _Interner) -> RankTrace | None:
    """parse_fr_dump's trace of a pickle read in compact form; None where the general path must read it."""
    scan = scan_fr_pickle(data)
    if scan is None or not looks_like_fr(scan.header):
        return None
    try:
        head = scan.header
        trace = _new_trace(head["version"], head.get("rank"), head.get("pg_config"), path, "flight_recorder-pickle")
        parts = parts_from_scan(scan, interner)
        if parts is None:
            return None
        _fill_coded(trace, interner, *parts)
    except READ_ERRORS:
        return None
    return trace


def load_fr_json(obj: dict, path: str, interner: _Interner | None = None) -> RankTrace:
    """A JSON dump already parsed into a dict (the general path; see parse_fr_json_fast)."""
    return parse_fr_dump(obj, path, "flight_recorder-json", interner=interner)
