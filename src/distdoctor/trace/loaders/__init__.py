"""Load per-rank traces from files or directories into one TraceSet, whatever produced them.

Dispatch is by content, never by extension: a pickle opcode stream is a Flight Recorder pickle (read with the
safe unpickler), a first line with the distdoctor-trace header is native JSON lines, any other JSON object with
`version` and `entries` is a Flight Recorder JSON dump, text with begin/end markers or NCCL INFO calls is a per-rank
log (logs.py, nccl_log.py). A file that cannot be used is a LoadError with its reason; the rest still load.

After loading, the set is made consistent:
- a rank's recorder trace and its Flight Recorder dump are merged into one view (merge.py); other duplicate
  ranks: the first file (in sorted path order) wins, later ones are LoadErrors;
- mixed versions: Flight Recorder dumps whose version differs from the majority are LoadErrors (one job writes
  one version; mixing dumps from two jobs would produce nonsense matches);
- group membership missing from a dump (Gloo's pg_config lists none) is inferred from which ranks issued on the
  group anywhere in the set (marked `inferred`), and the default group '0' spans the whole world;
- world size: the largest of --world-size, a dump's own statement, max rank + 1, and the group size implied by
  all_gather / reduce_scatter size relations on the default group (so a lost last rank is still counted).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import stat
from collections import Counter

from distdoctor.collectives import get_spec
from distdoctor.trace.coded import CODED_FIELDS, CodedEntries
from distdoctor.trace.loaders.flight_recorder import (_Interner, load_fr_json, load_fr_pickle, looks_like_fr,
                                                      parse_fr_json_fast)
from distdoctor.trace.loaders.fr_json_scan import kernels
from distdoctor.trace.loaders.fr_pickle_scan import kernels as pickle_kernels
from distdoctor.trace.loaders.merge import merge_rank, renumber_recorder_only
from distdoctor.trace.loaders.safe_pickle import printable
from distdoctor.trace.loaders.logs import link_logs, load_log, looks_like_log
from distdoctor.trace.loaders.native import is_native, load_native
from distdoctor.trace.loaders.readahead import Readahead
from distdoctor.trace.loaders.stream import (PrefixCheck, SparseEntries, held_entries, members_back, members_by_key,
                                             window_of, windowed_summary)
from distdoctor.trace.model import (DEFAULT_GROUP, ENTRY_FIELDS, Entry, EntryColumns, GroupInfo, LoadError, RankTrace,
                                   TraceSet, entry_column, numel)
from distdoctor.trace.summary import summarize

try:  # a declared dependency (about 2x faster on big dumps); the stdlib parser stays as the fallback
    import orjson as _fastjson
except ImportError:  # pragma: no cover - depends on the environment
    _fastjson = None


# orjson recurses on the native stack: a hostile file nested ~150 000 deep kills the process with SIGSEGV
# (orjson 3.8, 8 MiB stack). Nesting depth is at most the number of opening brackets, so orjson only gets files
# with few enough of them to be safe (a 2000-entry Flight Recorder dump has ~19 000); the rest go to the stdlib
# parser, which raises RecursionError instead of crashing.
FASTJSON_MAX_OPENS = 40_000


def _json_loads(data: bytes):
    if _fastjson is not None and data.count(b"[") + data.count(b"{") <= FASTJSON_MAX_OPENS:
        return _fastjson.loads(data)
    return json.loads(data)


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


SUBDIR_NOT_READ = "a subdirectory, not read (recursive reading is off)"
# `distdoctor run --dump-layout host` writes DUMP_DIR/host-<name>/rank_<r>.jsonl (recorder/layout.py): those
# subdirectories are part of the dump set and are read without --recursive
HOST_DIR_PREFIX = "host-"


def _own_files(directory: str, errors: list[LoadError]) -> list[str]:
    try:
        return [os.path.join(directory, n) for n in sorted(os.listdir(directory)) if not n.startswith(".")]
    except OSError as exc:
        errors.append(LoadError(directory, f"cannot list the directory ({exc.strerror})"))
        return []


def expand_paths(paths: list[str], recursive: bool = True) -> tuple[list[str], list[LoadError]]:
    """The files under `paths`. A directory gives its own files; with `recursive`, those of its whole tree too
    (hidden entries skipped). Without it, each subdirectory becomes one LoadError (SUBDIR_NOT_READ)."""
    files: list[str] = []
    errors: list[LoadError] = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            if recursive:
                for root, dirs, names in os.walk(p):
                    dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                    found.extend(os.path.join(root, n) for n in names if not n.startswith("."))
            else:
                try:
                    names = sorted(n for n in os.listdir(p) if not n.startswith("."))
                except OSError as exc:
                    errors.append(LoadError(p, f"cannot list the directory ({exc.strerror})"))
                    continue
                for n in names:
                    full = os.path.join(p, n)
                    if os.path.isdir(full) and n.startswith(HOST_DIR_PREFIX):
                        found.extend(_own_files(full, errors))
                    elif os.path.isdir(full):
                        errors.append(LoadError(full, SUBDIR_NOT_READ))
                    else:
                        found.append(full)
            # Regular files only: a device or a FIFO (say /dev/hwrng under a directory given by mistake) would
            # block the read forever.
            found = [f for f in found if _is_regular(f)]
            if not found:
                errors.append(LoadError(p, "directory holds no files"))
            files.extend(sorted(found))
        elif os.path.isfile(p):
            files.append(p)
        else:
            errors.append(LoadError(p, "no such file or directory"))
    real: set[str] = set()  # one file reached twice (glog's `prog.INFO` is a link to the newest log) is read once
    files = [f for f in files if not (os.path.realpath(f) in real or real.add(os.path.realpath(f)))]
    return files, errors


def load_file(path: str, interner: _Interner | None = None) -> RankTrace:
    """Load one file; raise ValueError(reason) when it cannot be used."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ValueError(f"cannot read ({exc.strerror})") from None
    if not data or (data[:1].isspace() and data.isspace()):
        raise ValueError("empty file")
    if data[:1] == b"\x80":  # pickle protocol >= 2 starts with PROTO
        return load_fr_pickle(data, path, interner)
    # Sniff the format from the head only: a Flight Recorder JSON dump is one line of a megabyte or more, and
    # scanning (or copying) it to find a first line costs as much as a third of decoding it. A distdoctor trace
    # names its format first in its header line (see trace/model.dumps).
    head = data[:SNIFF_BYTES]
    newline = head.find(b"\n")
    first_line = head if newline < 0 else head[:newline]
    if is_native(first_line):
        return load_native(data, path)
    if looks_like_log(head):  # per-rank text logs: before a log starting with '[' or 'c' is taken for JSON or a pickle
        return load_log(data, path)
    start = _LEADING_SPACE.match(data).end()
    if data[start:start + 1] == b"{":
        fast = parse_fr_json_fast(data, path, interner or _Interner())
        if fast is not None:
            return fast
    if data[start:start + 1] in (b"{", b"["):
        try:
            obj = _json_loads(data)
        except RecursionError:
            raise ValueError("corrupt JSON (nested too deeply)") from None
        except ValueError as exc:
            raise ValueError(f"corrupt or truncated JSON ({str(exc).splitlines()[0]})") from None
        if not looks_like_fr(obj):
            raise ValueError("JSON but not a trace: neither a Flight Recorder dump nor a distdoctor-trace file")
        return load_fr_json(obj, path, interner)
    if data[:2] in (b"(d", b"}q", b"(l", b"]q") or data[:1] == b"c":
        return load_fr_pickle(data, path, interner)  # protocol 0/1 pickles
    return load_log(data, path, sniffed=False)  # the last format tried: markers further in, or 'unrecognized format'


_LEADING_SPACE = re.compile(rb"\s*")
SNIFF_BYTES = 1 << 16


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while millions of acyclic objects are built: otherwise every few
    thousand allocations it rescans all of them (about a third of the load time on a 1024-rank set)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


PARALLEL_MIN_FILES = 64  # below this, starting worker processes costs more than it saves


def _load_one(path: str, interner: _Interner) -> RankTrace | LoadError:
    try:
        return load_file(path, interner)
    except ValueError as exc:
        return LoadError(path, str(exc))
    except (MemoryError, RecursionError) as exc:
        return LoadError(path, f"too large or too deeply nested to load ({type(exc).__name__})")


_SHARED_FIELDS = tuple(i for i, name in enumerate(ENTRY_FIELDS)
                       if name in ("in_sizes", "out_sizes", "in_dtypes", "out_dtypes"))


def _start_readers(files: list[str]) -> None:
    """Start the compiled readers of the Flight Recorder forms the set holds (by the files' first bytes)."""
    forms: set[str] = set()
    for path in files:
        with contextlib.suppress(OSError), open(path, "rb") as f:
            head = f.read(64)
            forms.add("pickle" if head[:1] == b"\x80" else "json" if head.lstrip()[:1] == b"{" else "other")
        if {"json", "pickle"} <= forms:
            break
    for form, start in (("json", kernels), ("pickle", pickle_kernels)):
        if form in forms:
            start()


def _load_compact(path: str, stream: bool = False):
    """Worker side of the parallel load: a trace travels back in compact form (a JSON dump's CodedEntries: a few
    arrays), or as its columns (lists of plain values pickle fast; pickle's memo sends each shared size/dtype list
    once per trace), not as objects. `stream`: only the entries the analysis may read one by one travel, with
    the rank's digest (stream.py); the result is then (trace, compact form, interned, digest)."""
    gc.disable()  # this worker only builds acyclic objects; see gc_paused
    got = _load_one(path, _WORKER_INTERNER)
    if isinstance(got, LoadError):
        return got
    summarize(got)  # here, in parallel, rather than in the parent
    if stream:
        members_by_key(got)
        positions, digest = window_of(got, got.summary)
        if positions is not None:
            n = len(got.entries)
            got.summary = windowed_summary(got.summary, digest)
            got.entries = held_entries(got.entries, positions)
            trace, held, interned = _compact(got)
            return trace, ("window", n, positions, held), interned, digest
        return (*_compact(got), digest)
    return _compact(got)


def _compact(got: RankTrace):
    entries = got.entries
    coded = getattr(entries, "coded", None)
    if coded is not None:  # a few arrays: the parent expands them into columns
        got.entries = []
        return got, coded, None
    columns = list(entries.columns) if isinstance(entries, EntryColumns) else \
        [entry_column(entries, name) for name in ENTRY_FIELDS]
    got.entries = []
    # Size/dtype columns travel as indexes into the interner's lists (small ints: cheap to pickle, and the parent
    # maps them back with one C-level pass instead of hashing every entry's list). A column holding any list
    # the interner did not make (an empty one, a native trace's) travels as objects.
    interned = [*_WORKER_INTERNER.sizes.values(), *_WORKER_INTERNER.strs.values()]
    position = {id(v): k for k, v in enumerate(interned)}
    for i in _SHARED_FIELDS if columns and columns[0] else ():
        try:
            columns[i] = list(map(position.__getitem__, map(id, columns[i])))
        except KeyError:
            pass
    return got, columns, interned


_WORKER_INTERNER = _Interner()
_SHARED_ROW_FIELDS = {i for i, name in enumerate(CODED_FIELDS) if ENTRY_FIELDS.index(name) in _SHARED_FIELDS}


def _share_key(value: list) -> tuple:
    """Sizes ([[4096, 1024]]) and dtypes (['Float']) give keys of different shapes, so they never collide."""
    return tuple(tuple(x) if isinstance(x, list) else x for x in value)


def _load_parallel(files: list[str], jobs: int, check: PrefixCheck | None = None
                   ) -> list[RankTrace | LoadError] | None:
    """Parse files in `jobs` forked workers; the parent keeps each trace's columns (entries are built when read)
    and re-shares equal size/dtype lists across ranks (the matcher's fast path compares them by identity). None
    when processes are unavailable. With `check`, load streaming (stream.py): digests go to `check`."""
    import functools
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    if "fork" not in mp.get_all_start_methods():
        return None
    _start_readers(files)  # so that workers inherit them
    load = functools.partial(_load_compact, stream=check is not None)
    shared: dict[tuple, list] = {}
    out: list[RankTrace | LoadError] = []
    ahead = Readahead(files)  # asks for the first files at once
    try:
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
            for got in pool.map(load, files, chunksize=8):
                out.append(_unpack(got, shared, check))
                ahead.advance(len(out))
    except (OSError, RuntimeError):  # no processes here (sandbox, exhausted): load in this process instead
        return None
    return out


def _unpack(got, shared: dict[tuple, list], check: PrefixCheck | None) -> RankTrace | LoadError:
    """A worker's result as a trace whose equal size/dtype lists are shared with every other rank's."""
    if isinstance(got, LoadError):
        return got
    window = None
    if check is not None:
        *got, digest = got
        members_back(got[0], check.members)
        if digest is not None:
            check.add(digest)
        else:
            check.whole_only.append(got[0].path)
        if isinstance(got[1], tuple) and got[1][:1] == ("window",):
            _, n, positions, held = got[1]
            window = (n, positions)
            got[1] = held
    trace = _unpack_one(*got, shared)
    if window is not None:
        trace.entries = SparseEntries(window[0], window[1], trace.entries, trace.path)
    return trace


def _unpack_one(trace: RankTrace, columns, interned, shared: dict[tuple, list]) -> RankTrace:
    """One worker result (trace, compact entries, interned lists) back into a trace."""
    if isinstance(columns, CodedEntries):
        columns.rows = [tuple(shared.setdefault(_share_key(v), v) if i in _SHARED_ROW_FIELDS and v
                              else v for i, v in enumerate(row)) for row in columns.rows]
        trace.entries = EntryColumns(None, columns)
        return trace
    if columns and columns[0]:
        table = [shared.setdefault(_share_key(v), v) for v in interned]
        for i in _SHARED_FIELDS:
            if type(columns[i][0]) is int:
                columns[i] = list(map(table.__getitem__, columns[i]))
                continue
            # A trace holds a handful of distinct lists: canonicalize those, then map the column.
            canon = {}
            for value in {id(v): v for v in columns[i]}.values():
                canon[id(value)] = shared.setdefault(_share_key(value), value) if value else value
            columns[i] = list(map(canon.__getitem__, map(id, columns[i])))
        # Native traces stay objects (the recorder's are small and hold stacks, errors...).
        trace.entries = EntryColumns(columns) if trace.source.startswith("flight_recorder") else \
            list(map(Entry, *columns))
    return trace


def load_traces(paths: list[str], world_size: int | None = None, jobs: int | None = None,
                recursive: bool = True, stream: bool | str = False) -> TraceSet:
    """Load every trace under `paths` (files or directories; `recursive`: their whole trees) into one TraceSet.

    Many files are parsed in parallel (one worker per CPU, `jobs` to override; 1 = in this process).
    `stream`: keep of each Flight Recorder trace only what the analysis reads one by one (stream.py); "auto": from
    STREAM_MIN_FILES files on, or as DISTDOCTOR_STREAM=on/off says. `ts.streamed` says whether it did (False when
    the trimming could not be proven invisible: the set is then loaded whole). The analysis finds the same on
    a streamed set except stragglers, which compare every common entry's times: a caller whose analysis found
    nothing else reloads the set whole (diagnose/command.py)."""
    files, errors = expand_paths(list(paths), recursive)
    ts = TraceSet(errors=errors)
    if jobs is None:
        jobs = min(os.cpu_count() or 1, 8) if len(files) >= PARALLEL_MIN_FILES else 1
    if stream == "auto":
        setting = os.environ.get("DISTDOCTOR_STREAM", "").lower()
        stream = setting in ("on", "1") or (setting not in ("off", "0") and len(files) >= STREAM_MIN_FILES)
    check = PrefixCheck() if stream else None
    with gc_paused():
        results = _load_parallel(files, jobs, check) if jobs > 1 else None
        if results is None and check is not None:
            shared: dict[tuple, list] = {}
            results = [_unpack(_load_compact(path, stream=True), shared, check) for path in files]
        elif results is None:
            _start_readers(files)
            interner = _Interner()
            results = [_load_one(path, interner) for path in files]
    loaded: list[RankTrace] = []
    for got in results:
        if isinstance(got, LoadError):
            ts.errors.append(got)
        else:
            loaded.append(got)
    loaded = link_logs(loaded, ts.errors)  # per-rank logs: join a rank's other trace, link NCCL calls across ranks
    _drop_mixed_versions(loaded, ts.errors)
    # Several files for one rank: the recorder's trace and Flight Recorder's dump (what `distdoctor run` writes:
    # rank_<r>.jsonl beside rank_<r>.fr.pkl) become one view of the rank (merge.py). Beyond one of each kind,
    # the first in path order (a pickle before a JSON dump: it may carry frames) wins; the others are reported.
    loaded.sort(key=lambda t: _SOURCE_RANK.get(t.source, 0))
    flight_recorder: dict[int, RankTrace] = {}
    for trace in loaded:
        if trace.rank < 0:
            ts.errors.append(LoadError(trace.path, f"negative rank {trace.rank}"))
        elif trace.rank >= MAX_WORLD_SIZE:
            ts.errors.append(LoadError(trace.path, f"rank {trace.rank} is beyond any real world size "
                                                   f"({MAX_WORLD_SIZE:,}); the file is corrupt"))
        elif trace.source.startswith("flight_recorder") and trace.rank not in flight_recorder:
            flight_recorder[trace.rank] = trace
            ts.ranks.setdefault(trace.rank, trace)
        elif trace.rank in ts.ranks:  # recorder traces sort first: a Flight Recorder dump never precedes one
            kept = ts.ranks[trace.rank]
            ts.errors.append(LoadError(trace.path, f"duplicate rank {trace.rank}: already loaded from "
                                                   f"{kept.path}; this file is ignored"))
        else:
            ts.ranks[trace.rank] = trace
    for rank, fr in flight_recorder.items():
        own = ts.ranks[rank]
        if own is not fr:
            ts.ranks[rank] = merge_rank(own, fr)
    renumber_recorder_only(ts.ranks)
    ts.ranks = dict(sorted(ts.ranks.items()))
    ts.world_size = _world_size(ts, world_size)
    _infer_groups(ts)
    ts.streamed = False
    if check is not None and check.trimmed:
        why = f"not Flight Recorder dumps: {check.whole_only[0]}" if check.whole_only else check.proven(ts)
        if why is not None:  # the whole set, as the analysis would read it
            whole = load_traces(paths, world_size, jobs, recursive, stream=False)
            whole.stream_note = why
            return whole
        ts.streamed = True
    return ts


# From this many files on, diagnose loads streaming (stream.py): a set this large is where memory matters.
STREAM_MIN_FILES = 512


_SOURCE_RANK = {"native": 0, "simulated": 0, "flight_recorder-pickle": 1, "flight_recorder-json": 2}


def _drop_mixed_versions(loaded: list[RankTrace], errors: list[LoadError]) -> None:
    fr = [t for t in loaded if t.source.startswith("flight_recorder")]
    if not fr:
        return
    counts = Counter(t.version for t in fr)
    if len(counts) < 2:
        return
    majority, _ = counts.most_common(1)[0]
    for t in fr:
        if t.version != majority:
            errors.append(LoadError(t.path, f"Flight Recorder version {printable(str(t.version))} differs from the "
                                            f"other dumps' {printable(str(majority))}: dumps of one job share one "
                                            "version; this file is ignored"))  # (a damaged version: escaped)
    loaded[:] = [t for t in loaded if not t.source.startswith("flight_recorder") or t.version == majority]


# Far above any real job, far below what would exhaust memory when the world's ranks are listed: a corrupt
# dump (rank 10**12, an all_gather of 10**30 elements) must not make the loader build a list that size.
MAX_WORLD_SIZE = 1 << 20


def _world_size(ts: TraceSet, given: int | None) -> int | None:
    sizes = [given or 0]
    for t in ts.ranks.values():
        sizes.append(t.world_size or 0)
        sizes.append(t.rank + 1)
        g = t.groups.get(DEFAULT_GROUP)
        if g and not g.inferred:
            sizes.append(len(g.ranks))
        sizes.append(_implied_size(t, DEFAULT_GROUP))
    n = max((x for x in sizes if isinstance(x, int) and x <= MAX_WORLD_SIZE), default=0)
    return n or None


def _implied_size(trace: RankTrace, group: str) -> int:
    """Group size implied by all_gather/reduce_scatter: out numel = n * in numel (resp. in = n * out)."""
    best = 0
    for i in summarize(trace).size_checks:  # each distinct (group, op, sizes) once; entries built only here
        e = trace.entries[i]
        g, op, in_sizes, out_sizes = e.group, e.op, e.in_sizes, e.out_sizes
        if g != group:
            continue
        if not in_sizes or not out_sizes:
            continue
        ins, outs = numel(in_sizes), numel(out_sizes)
        small, big = (ins, outs) if op == "all_gather" else (outs, ins)
        if small and big % small == 0 and get_spec(op).out_numel(ins, big // small) == outs:
            best = max(best, big // small)
    return best


def _infer_groups(ts: TraceSet) -> None:
    """One membership per group for the whole set: given where any dump states it, else inferred."""
    given: dict[str, list[int]] = {}
    issued: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    for t in ts.ranks.values():
        for name, g in t.groups.items():
            if not g.inferred and g.ranks:
                given.setdefault(name, g.ranks)
            if g.desc and not descs.get(name):
                descs[name] = g.desc
        for name in summarize(t).groups:
            issued.setdefault(name, set()).add(t.rank)
    world = list(range(ts.world_size or 0))
    world_inferred = given.get(DEFAULT_GROUP) != world  # (once: each comparison walks the world's ranks)
    for t in ts.ranks.values():
        for name in set(t.groups) | summarize(t).groups:
            if name == DEFAULT_GROUP:  # the default group is the world, however many ranks left a dump
                t.groups[name] = GroupInfo(name, world, world_inferred, descs.get(name, "default_pg"))
            elif name in given:
                # one list per group, shared by its members' traces (read-only): a 2048-rank group's members
                # copied into each of its 2048 traces would take 32 MB
                t.groups[name] = GroupInfo(name, given[name], False, descs.get(name, ""))
            else:
                t.groups[name] = GroupInfo(name, sorted(issued.get(name, {t.rank})), True, descs.get(name, ""))


__all__ = ["load_traces", "load_file", "expand_paths", "SUBDIR_NOT_READ"]
