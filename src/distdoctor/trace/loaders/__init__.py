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
import os
import re
import stat
from collections import Counter

from distdoctor.collectives import implied_size
from distdoctor.trace.coded import Entries, frozen
from distdoctor.trace.loaders.flight_recorder import load_fr_json_bytes, load_fr_pickle
from distdoctor.trace.loaders.fr_json_scan import kernels
from distdoctor.trace.loaders.fr_pickle_scan import kernels as pickle_kernels
from distdoctor.trace.loaders.fr_reader import Interner
from distdoctor.trace.loaders.completion import refute_completions
from distdoctor.trace.loaders.merge import merge_rank, renumber_recorder_only
from distdoctor.trace.loaders.safe_pickle import printable
from distdoctor.trace.loaders.launcher_log import LaunchLog, apply_account, load_launcher_log, looks_like_launcher_log
from distdoctor.trace.loaders.logs import link_logs, load_log, looks_like_log
from distdoctor.trace.loaders.native import is_native, load_native
from distdoctor.trace.loaders.readahead import Readahead
from distdoctor.trace.loaders.stream import (PrefixCheck, SparseEntries, members_back, members_by_key, window_of,
                                             windowed_summary)
from distdoctor.trace.model import DEFAULT_GROUP, GroupInfo, LoadError, RankTrace, TraceSet, numel
from distdoctor.trace.summary import summarize


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
    where = _real_path_in({})
    kept = []
    for f in files:
        path = where(f)
        if path not in real:
            real.add(path)
            kept.append(f)
    return kept, errors


def _real_path_in(folders: dict):
    """os.path.realpath of a file, resolving each folder once (`folders` keeps them): 16 384 files of one
    directory cost one lstat each, not one per component of their path."""
    def real(path: str) -> str:
        head, tail = os.path.split(path)
        folder = folders.get(head)
        if folder is None:
            folder = folders[head] = os.path.realpath(head)
        full = os.path.join(folder, tail)
        return os.path.realpath(full) if not tail or os.path.islink(full) else full
    return real


def load_file(path: str, interner: Interner | None = None) -> RankTrace | LaunchLog:
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
    if looks_like_launcher_log(head, data[-SNIFF_BYTES:]):  # torchrun's console log: every rank's end, no calls
        return load_launcher_log(data, path)
    if looks_like_log(head):  # per-rank text logs: before a log starting with '[' or 'c' is taken for JSON or a pickle
        return load_log(data, path)
    start = _LEADING_SPACE.match(data).end()
    if data[start:start + 1] in (b"{", b"["):
        return load_fr_json_bytes(data, path, interner)
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


def _load_one(path: str, interner: Interner) -> RankTrace | LoadError:
    try:
        return load_file(path, interner)
    except ValueError as exc:
        return LoadError(path, str(exc))
    except (MemoryError, RecursionError) as exc:
        return LoadError(path, f"too large or too deeply nested to load ({type(exc).__name__})")


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


def _start_worker() -> None:
    """A load worker builds only acyclic objects (see gc_paused), and reads thousands of files of a megabyte
    or more one after another: glibc's malloc would give each file's buffer and arrays back to the kernel
    when freed and fault the same pages in again for the next file (about 260 page faults a file, a quarter of
    a worker's CPU). The worker keeps freed memory up to HEAP_KEPT for the next file instead."""
    gc.disable()
    with contextlib.suppress(OSError, AttributeError):  # (not glibc: its own malloc's behaviour stands)
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(_M_TRIM_THRESHOLD, HEAP_KEPT)
        libc.mallopt(_M_MMAP_THRESHOLD, HEAP_KEPT)  # (both: once one is set, glibc stops adapting the other)


HEAP_KEPT = 32 << 20  # (glibc's largest mmap threshold on 64-bit)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def _load_compact(path: str, stream: bool = False):
    """Worker side of the parallel load: the trace, summed up here (in parallel rather than in the parent). A
    Flight Recorder trace's entries travel in their compact form (a few arrays, trace/coded.py). `stream`: only
    the entries the analysis may read one by one travel, with the rank's digest (stream.py); the result is then
    (trace, digest)."""
    gc.disable()  # this worker only builds acyclic objects; see gc_paused
    got = _load_one(path, _WORKER_INTERNER)
    if isinstance(got, (LoadError, LaunchLog)):
        return got
    summarize(got)
    if not stream:
        return got
    members_by_key(got)
    positions, digest = window_of(got, got.summary)
    if positions is not None:
        got.summary = windowed_summary(got.summary, digest)
        got.entries = SparseEntries(len(got.entries), positions, got.entries.take(positions), got.path)
    return got, digest


_WORKER_INTERNER = Interner()


def _shared_rows(entries: Entries, shared: dict) -> None:
    """Equal size/dtype lists shared across ranks (the matcher's fast path compares them by identity first)."""
    def share(value):
        return shared.setdefault(frozen(value), value) if value else value

    entries.rows = [row._replace(in_sizes=share(row.in_sizes), out_sizes=share(row.out_sizes),
                                 in_dtypes=share(row.in_dtypes), out_dtypes=share(row.out_dtypes))
                    for row in entries.rows]


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
    try:
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork"), initializer=_start_worker) as pool:
            results = pool.map(load, files, chunksize=8)  # (forks the workers, before our thread starts)
            ahead = Readahead(files, background=True)  # asks for the first files at once
            try:
                for got in results:
                    out.append(_unpack(got, shared, check))
                    ahead.advance(len(out))
            finally:
                ahead.close()
    except (OSError, RuntimeError):  # no processes here (sandbox, exhausted): load in this process instead
        return None
    return out


def _unpack(got, shared: dict, check: PrefixCheck | None) -> RankTrace | LoadError:
    """A worker's result as a trace whose equal size/dtype lists are shared with every other rank's."""
    if isinstance(got, (LoadError, LaunchLog)):
        return got
    if check is not None:
        got, digest = got
        members_back(got, check.members)
        if digest is not None:
            check.add(digest)
        else:
            check.whole_only.append(got.path)
    entries = got.entries.held if isinstance(got.entries, SparseEntries) else got.entries
    if isinstance(entries, Entries):
        _shared_rows(entries, shared)
    return got


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
            interner = Interner()
            results = [_load_one(path, interner) for path in files]
    assemble(results, ts, world_size)
    ts.streamed = False
    if check is not None and check.trimmed:
        why = f"not Flight Recorder dumps: {check.whole_only[0]}" if check.whole_only else check.proven(ts)
        if why is not None:  # the whole set, as the analysis would read it
            whole = load_traces(paths, world_size, jobs, recursive, stream=False)
            whole.stream_note = why
            return whole
        ts.streamed = True
    return ts


def assemble(results: list, ts: TraceSet, world_size: int | None = None) -> TraceSet:
    """One view of the job from the loaded traces (and the LoadErrors of what did not load): per-rank logs linked,
    one trace per rank (a recorder trace merged with its Flight Recorder dump), the world size, every group's
    members. load_traces' last step; the live watcher's answers (diagnose/live.py), read in memory, take it too."""
    loaded: list[RankTrace] = []
    launch: LaunchLog | None = None
    for got in results:
        if isinstance(got, LoadError):
            ts.errors.append(got)
        elif isinstance(got, LaunchLog) and launch is None:
            launch = got
        elif isinstance(got, LaunchLog):
            launch.merge(got)  # one agent a host: one account
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
    if launch is not None:
        apply_account(ts, launch)
    ts.refuted = refute_completions(ts)
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
        best = max(best, implied_size(op, numel(in_sizes), numel(out_sizes)))
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
