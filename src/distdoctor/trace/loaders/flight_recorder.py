"""PyTorch Flight Recorder dumps (versions 2.x, NCCL and Gloo styles) -> RankTrace.

Two physical forms carry the same dict:
- pickle: what `torch._C._distributed_c10d._dump_fr_trace` / `_dump_nccl_trace` return and what
  `TORCH_FR_DUMP_TEMP_FILE<rank>` holds. A dump is untrusted input, so it is read with `SafeUnpickler`
  (safe_pickle.py), which builds only builtin containers and scalars and refuses every global.
- JSON: `_dump_fr_trace_json` (no stack frames; `time_discovered_*` are 0 instead of None; pg_status values
  are strings).

The entry fields read, their roles and conversions are fr_schema.FIELDS; the header's are `version`, `rank`,
`pg_config` {name: {name, desc, ranks: "[0, 1]"}}, `pg_status` (each group's enqueued / started / completed
frontier, trace/frontier.py) and `nccl_version` (new_trace: every reader's header goes through it). Two readers
per form: the C ones (fr_json_scan, fr_pickle_scan), for every load, and the Python one (fr_reader), where they
were not built or hand a file over; both give the same trace.

Quirks handled here (checked on torch 2.13 Gloo dumps): the default group is `''` in pg_config but `'0'` in
entries; pg_config may list no members (membership is then inferred across the trace set, see
loaders/__init__.py); Gloo entries stay `scheduled` and signal completion only by `retired`; Gloo records no
p2p. FR does not record broadcast/reduce roots, so `root` stays None.
"""

from __future__ import annotations

import functools
import json
import re

import msgspec
import numpy as np

from distdoctor.trace.coded import Entries
from distdoctor.trace.loaders.fr_json_scan import ScannedDump, scan_fr_json
from distdoctor.trace.loaders.fr_pickle_scan import scan_fr_pickle
from distdoctor.trace.loaders.fr_reader import (READ_ERRORS, Interner, frames_of, from_rows, read_entries, read_strict,
                                                strict_json)
from distdoctor.trace.loaders.fr_schema import INT_FIELDS, ROW_FIELDS
from distdoctor.trace.loaders.safe_pickle import PICKLE_ALLOWED, SafeUnpickler, safe_unpickle  # noqa: F401 (API)
from distdoctor.trace.frontier import read_status
from distdoctor.trace.model import DEFAULT_GROUP, GroupInfo, RankTrace

try:  # a declared dependency (about 2x faster on big dumps); the stdlib parser stays as the fallback
    import orjson as _fastjson
except ImportError:  # pragma: no cover - depends on the environment
    _fastjson = None

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


class Members(list):
    """A group's members as dumps state them: one list per distinct text, shared by every trace of a load worker
    that states it (read-only; a world-sized list copied into each of 16 384 traces would cost world x world).
    `key` names it, so that the worker sends it once (stream.members_by_key)."""

    __slots__ = ("key",)


def _parse_ranks(raw: object) -> list[int]:
    if isinstance(raw, str):
        return _parse_rank_text(raw)  # every rank's dump repeats the same member lists
    return _parse_rank_list(raw)


@functools.lru_cache(maxsize=256)
def _parse_rank_text(text: str) -> Members:
    members = Members(_parse_rank_list(json.loads(text) if text.strip() else []))
    members.key = ("members", len(members), hash(text))
    return members


def _parse_rank_list(raw: object) -> list[int]:
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"pg_config ranks is {type(raw).__name__}, not a list")
    return sorted(int(r) for r in raw)


def new_trace(header: dict, path: str, source: str, rank: int | None = None) -> RankTrace:
    """The trace of a dump's header (every reader's: the dump's top level, entries left out): version, rank (the
    dump's own, else `rank`, else the file name's), group configuration."""
    version = str(header["version"])
    if not version.startswith("2."):
        raise ValueError(f"unsupported Flight Recorder version {version!r} (2.x is supported)")
    rank = header.get("rank") if rank is None else rank
    rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else rank_from_filename(path)
    if rank is None:
        raise ValueError("cannot tell which rank this dump is from: name it with a rank suffix (e.g. rank_3)")
    trace = RankTrace(rank=rank, source=source, path=path, version=version)
    pg_config = header.get("pg_config") or {}
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
    trace.pg_status, trace.comm_lib_version = read_status(header.get("pg_status"), header.get("nccl_version")
                                                          or header.get("comm_lib_version"))
    return trace


def parse_fr_dump(obj: object, path: str, source: str, rank: int | None = None,
                  interner: Interner | None = None) -> RankTrace:
    """One Flight Recorder dump dict, read by the Python reader (fr_reader.py). Raises ValueError(reason)."""
    if not looks_like_fr(obj):
        raise ValueError("not a Flight Recorder dump (no 'version' with 'entries' or 'pg_config')")
    trace = new_trace(obj, path, source, rank)
    _fill(trace, *read_entries(obj.get("entries", []), interner or Interner()))
    return trace


def _fill(trace: RankTrace, rows: list[tuple], codes: np.ndarray, own: dict, stacks: list | None = None,
          stack_codes: np.ndarray | None = None) -> None:
    """`trace`'s entries from the readers' parts: rows as fr_schema.interpret gives them (peers group-local),
    each entry's row, its own values, its stack. Groups the dump's pg_config does not list get an inferred
    membership (the trace-set loader infers it from who issued on them)."""
    for row, _, desc in rows:
        if row.group not in trace.groups:
            trace.groups[row.group] = GroupInfo(row.group, [], True, desc)
    rows = [row if row.peer is None else row._replace(peer=_global_peer(trace, row.group, row.peer))
            for row, _, _ in rows]
    trace.entries = Entries(rows, codes, own, stacks, stack_codes)


def _global_peer(trace: RankTrace, group: str, local: int) -> int | None:
    """Profiling names give p2p peers as group-local ranks; the model keeps global ranks."""
    members = trace.groups[group].ranks
    if members and local < len(members):
        return members[local]
    return local if group == DEFAULT_GROUP else None  # default group: local rank == global rank


def _own_from_scan(ints: dict, known: dict, p2p: np.ndarray) -> dict:
    """The own values of the entries a C reader read: `ints` field -> int64 values, `known` field -> whether
    each entry wrote an integer there (else None or absent; a record_id absent is the entry's position)."""
    own = {}
    for f in INT_FIELDS:
        values, unknown = ints[f.name], ~known[f.name]
        if f.required:
            if unknown.any():
                values = np.where(unknown, np.arange(len(values)), values)
            unknown = np.zeros(len(values), bool)
        if f.only is not None:
            unknown = unknown | (p2p if f.only == "collective" else ~p2p)
        own[f.model] = np.where(unknown | (values == 0), np.nan, values / 1e9) if f.seconds else (values, unknown)
    return own


# ---- JSON --------------------------------------------------------------------------------------------------

# orjson recurses on the native stack: a hostile file nested ~150 000 deep kills the process with SIGSEGV
# (orjson 3.8, 8 MiB stack). Nesting depth is at most the number of opening brackets, so orjson only gets files
# with few enough of them to be safe (a 2000-entry Flight Recorder dump has ~19 000); the rest go to the stdlib
# parser, which raises RecursionError instead of crashing.
FASTJSON_MAX_OPENS = 40_000


def json_loads(data: bytes):
    if _fastjson is not None and data.count(b"[") + data.count(b"{") <= FASTJSON_MAX_OPENS:
        return _fastjson.loads(data)
    return json.loads(data)


def load_fr_json_bytes(data: bytes, path: str, interner: Interner | None = None, scan: bool = True) -> RankTrace:
    """A JSON dump: read by the C scanner where it can (`scan` False: never, the tests' oracle), else parsed
    and read by the Python reader. Raises ValueError(reason)."""
    interner = interner or Interner()
    scanned = scan_fr_json(data) if scan else None
    trace = _from_json_scan(scanned, path, interner) if scanned is not None else None
    trace = trace or _from_strict(data, path, interner)  # (what the scanner hands over, too)
    if trace is not None:
        return trace
    try:
        obj = json_loads(data)
    except RecursionError:
        raise ValueError("corrupt JSON (nested too deeply)") from None
    except ValueError as exc:
        raise ValueError(f"corrupt or truncated JSON ({str(exc).splitlines()[0]})") from None
    if not looks_like_fr(obj):
        raise ValueError("JSON but not a trace: neither a Flight Recorder dump nor a distdoctor-trace file")
    return load_fr_json(obj, path, interner)


def _from_json_scan(scanned: ScannedDump, path: str, interner: Interner) -> RankTrace | None:
    """The trace of a dump the C scanner read: one entry of each group of equal row-field bytes is parsed here;
    None where the Python reader must read the file (it words the error, if there is one)."""
    loads = _fastjson.loads if _fastjson is not None else json.loads  # (the scan refused nesting beyond 256)
    try:
        header = loads(scanned.header)
        reps = [loads(text) for text in scanned.representatives]
        if not looks_like_fr(header) or not all(isinstance(r, dict) and not r.get("frames") for r in reps):
            return None  # (frames: the Python reader builds them)
        rows, rep_codes = from_rows(reps, interner)
        codes = rep_codes[scanned.groups]
        p2p = np.array([p2p for _, p2p, _ in rows] or [False])[codes]
        trace = new_trace(header, path, "flight_recorder-json")
        _fill(trace, rows, codes, _own_from_scan(*scanned.ints, p2p))
    except (*READ_ERRORS, RecursionError, MemoryError):
        return None
    return trace


def _from_strict(data: bytes, path: str, interner: Interner) -> RankTrace | None:
    """A JSON dump written as torch writes it, decoded into fr_reader.STRICT records (no dict per entry); None
    where it is not, or where the dict reading must word an error."""
    got = strict_json(data)
    if got is None:
        return None
    top, recs = got
    try:
        header = {key: msgspec.json.decode(value) for key, value in top.items()}
        if "version" not in header:
            return None
        trace = new_trace(header, path, "flight_recorder-json")
        _fill(trace, *read_strict(recs, interner))
    except (ValueError, RecursionError, MemoryError):  # (msgspec.DecodeError is a ValueError)
        return None
    return trace


def load_fr_json(obj: dict, path: str, interner: Interner | None = None) -> RankTrace:
    """A JSON dump already parsed into a dict."""
    return parse_fr_dump(obj, path, "flight_recorder-json", interner=interner)


# ---- pickle ------------------------------------------------------------------------------------------------

def load_fr_pickle(data: bytes, path: str, interner: Interner | None = None, scan: bool = True) -> RankTrace:
    """A pickled dump read by the C opcode reader where it can (fr_pickle_scan; `scan` False: never, the tests'
    oracle), else unpickled safely and read by the Python reader. Both give the same trace."""
    interner = interner or Interner()
    scanned = _from_pickle_scan(data, path, interner) if scan else None
    if scanned is not None:
        return scanned
    return parse_fr_dump(safe_unpickle(data), path, "flight_recorder-pickle", interner=interner)


def _from_pickle_scan(data: bytes, path: str, interner: Interner) -> RankTrace | None:
    """The trace of a pickle the C reader read; None where the Python reader must read it."""
    scan = scan_fr_pickle(data)
    if scan is None or not looks_like_fr(scan.header):
        return None
    try:
        rows, row_codes = from_rows([dict(zip(ROW_FIELDS, row)) for row in scan.rows], interner)
        codes = row_codes[scan.codes]
        p2p = np.array([p2p for _, p2p, _ in rows] or [False])[codes]
        ints, known = scan.ints_by_field()
        if known is None:
            return None  # a value of another type: the Python reader words it
        stacks, stack_codes = frames_of(scan.stacks, interner)
        if stacks is not None:
            stack_codes = stack_codes[scan.stack_codes]
        trace = new_trace(scan.header, path, "flight_recorder-pickle")
        _fill(trace, rows, codes, _own_from_scan(ints, known, p2p), stacks, stack_codes)
    except READ_ERRORS:
        return None
    return trace
