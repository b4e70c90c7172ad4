"""The in-process recorder: every torch.distributed collective and p2p call into a bounded per-rank ring buffer.

How it records. `enable()` replaces the public functions of `torch.distributed.distributed_c10d` (and the same
names re-exported by `torch.distributed`) with thin wrappers. A wrapper binds the call's arguments with a
describer (distdoctor.trace.describe), appends one small `_Record` (slots; shapes and dtypes, never tensors;
caller frames as (code, line) pairs, formatted only at dump time) to a `deque(maxlen=buffer_size)`, calls the
original, and marks the record completed. Async calls return a `TracedWork` (a `Work` subclass delegating to
the real one) whose wait()/is_completed() complete the record; the watchdog also polls pending async works.
No I/O and no locks on the hot path. A thread-local guard keeps nested calls (all_gather_object ->
all_gather, batch_isend_irecv -> isend) from being recorded twice: the outermost call wins, except for the
object collectives, which are not wrapped, so their inner tensor collectives are recorded with the same
sequence numbers Flight Recorder gives them.

Numbering: `seq` counts collectives per group from 1 in issue order, as Flight Recorder's collective_seq_id does
(barriers included). `p2p_seq` counts per (group, direction, peer) from 1, so the n-th send 0->1 matches the
n-th recv 1<-0. Group names are the process group's global name as torch assigns it ("0" for the default
group, "1", "2", ... for subgroups in creation order), the names Flight Recorder uses in its entries.

States: a blocking call is "started" from the moment it is called until it returns ("completed"); an async call
is "issued" until the backend hands back its Work, then "started" until wait() returns or is_completed() is
true. A call that raises keeps its state and gets `error`.

Limits: calls made through names imported before enable() (`from torch.distributed import all_reduce` at module
level) and collectives issued from C++ (DDP's gradient buckets) are not seen here; Flight Recorder, which
`enable()` turns on and which is dumped next to our file, records those.

The recorder becomes active in a process only when a process group exists (init_process_group is wrapped, or
enable() finds one): only then do the watchdog, signal and exception hooks start. That keeps it harmless in
processes that merely import torch, such as the torchrun agent.
"""

from __future__ import annotations

import functools
import importlib.abc
import itertools
import operator
import os
import socket
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

from distdoctor.trace import model
from distdoctor.trace.describe import DESCRIBERS, Call, describe_p2p_op
from distdoctor.trace.dumpfile import all_thread_stacks, ensure_private_dir, write_atomic

DEFAULT_BUFFER = 2000
DEFAULT_HANG_TIMEOUT = 300.0
DEFAULT_DUMP_DIR = "distdoctor-dumps"
CALLER_FRAMES = 4
_REDUCING = ("all_reduce", "reduce", "reduce_scatter")
_THIS_DIR = os.path.dirname(os.path.abspath(__file__))
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def _warn(message: str) -> None:
    print(f"distdoctor.trace: warning: {message}", file=sys.stderr, flush=True)


def _env_number(name: str, kind, default):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw)
        if value < 0:
            raise ValueError
        return value
    except ValueError:
        _warn(f"{name}={raw!r} is not a non-negative number; using {default}")
        return default


@dataclass
class RecorderConfig:
    dump_dir: str
    hang_timeout: float | None  # None or 0: no hang watchdog
    buffer_size: int = DEFAULT_BUFFER
    stacks: bool = True  # dumps include every thread's Python stack
    dump_on_exit: bool = False  # also dump at a clean exit (else only when a collective is still pending)
    frames: int = CALLER_FRAMES  # caller frames kept per call

    @classmethod
    def resolve(cls, dump_dir=None, hang_timeout=None, buffer_size=None, stacks=None, dump_on_exit=None):
        """Explicit arguments win over DISTDOCTOR_* environment variables, which win over defaults."""
        if dump_dir is None:
            dump_dir = os.environ.get("DISTDOCTOR_DUMP_DIR") or DEFAULT_DUMP_DIR
        if hang_timeout is None:
            hang_timeout = _env_number("DISTDOCTOR_HANG_TIMEOUT", float, DEFAULT_HANG_TIMEOUT)
        if buffer_size is None:
            buffer_size = _env_number("DISTDOCTOR_BUFFER", int, DEFAULT_BUFFER)
        if stacks is None:
            stacks = os.environ.get("DISTDOCTOR_STACKS", "1") != "0"
        if dump_on_exit is None:
            dump_on_exit = os.environ.get("DISTDOCTOR_DUMP_ON_EXIT", "0") == "1"
        frames = _env_number("DISTDOCTOR_FRAMES", int, CALLER_FRAMES)
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be at least 1, got {buffer_size}")
        if hang_timeout is not None and hang_timeout < 0:
            raise ValueError(f"hang_timeout must be >= 0 seconds, got {hang_timeout}")
        return cls(os.path.abspath(os.fspath(dump_dir)), hang_timeout or None, int(buffer_size), bool(stacks),
                   bool(dump_on_exit), int(frames))


class _Record:
    __slots__ = ("index", "group", "op", "raw_op", "seq", "p2p_seq", "in_shapes", "in_dtypes", "out_shapes",
                 "out_dtypes", "root", "peer", "reduce_op", "state", "t_created", "t_started", "t_completed",
                 "async_op", "thread", "frames", "error", "work")


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _reduce_name(op, name: str) -> str | None:
    if op is None:
        return "sum" if name in _REDUCING else None
    label = getattr(op, "name", None) or str(op)
    return str(label).rsplit(".", 1)[-1].lower()


def _line_of(code, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


class Recorder:
    def __init__(self, config: RecorderConfig):
        self.config = config
        self.buffer: deque[_Record] = deque(maxlen=config.buffer_size)
        self.pending: set[_Record] = set()
        self.seq: dict[str, int] = {}
        self.p2p_seq: dict[tuple, int] = {}
        self.groups: dict[object, tuple[str, list[int], str]] = {}  # process group -> (name, ranks, desc)
        self.group_infos: dict[str, model.GroupInfo] = {}  # every group seen, kept after destroy
        self._index = itertools.count()
        self.last_progress = time.time()
        self.hang_dumped = False
        self.active = False
        self.rank: int | None = None
        self.world_size: int | None = None
        self.dumps_written = 0
        self.final_dump_reason: str | None = None
        self._dump_lock = threading.RLock()
        self._dumping = False
        self.watchdog = None
        self.pid: int | None = None
        self._fork_hook_installed = False

    # ---- hot path ------------------------------------------------------------------------------------------
    def begin(self, raw: str, op: str, call: Call, is_p2p: bool) -> _Record | None:
        c10d = _c10d
        pg = call.group if call.group is not None else c10d._world.default_pg
        if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER:
            return None  # torch returns without communicating; nothing to record
        info = self.groups.get(pg)
        if info is None:
            info = self._learn_group(pg)
        name, ranks, _ = info
        r = _Record()
        now = time.time()
        r.index = next(self._index)
        r.group = name
        r.op = op if not is_p2p else call.direction
        r.raw_op = raw
        inputs, outputs = call.inputs, call.outputs
        r.in_shapes = tuple(map(_SHAPE, inputs))  # map + attrgetter: no Python frame per tensor
        r.in_dtypes = tuple(map(_DTYPE, inputs))
        r.out_shapes = tuple(map(_SHAPE, outputs))
        r.out_dtypes = tuple(map(_DTYPE, outputs))
        r.root = ranks[call.group_root] if call.group_root is not None else call.root
        r.reduce_op = call.reduce_op
        r.async_op = call.async_op
        r.t_created = now
        r.t_completed = None
        r.error = None
        r.work = None
        if is_p2p:
            peer = ranks[call.group_peer] if call.group_peer is not None else call.peer
            r.peer = peer
            key = (name, r.op, peer)
            r.p2p_seq = self.p2p_seq.get(key, 0) + 1
            self.p2p_seq[key] = r.p2p_seq
            r.seq = None
        else:
            r.peer = None
            r.p2p_seq = None
            r.seq = self.seq.get(name, 0) + 1
            self.seq[name] = r.seq
        if call.async_op:
            r.state, r.t_started = "issued", None
        else:
            r.state, r.t_started = "started", now
        r.thread = threading.get_ident()
        # (code, instruction offset) pairs; the line number is looked up at dump time (f_lineno costs more).
        frames = []
        left = self.config.frames
        f = sys._getframe(2) if left else None
        while f is not None and left:
            code = f.f_code
            if code.co_filename not in _SKIP_FILES:
                frames.append((code, f.f_lasti))
                left -= 1
            f = f.f_back
        r.frames = frames
        self.buffer.append(r)
        self.pending.add(r)
        self.last_progress = now
        return r

    def complete(self, r: _Record, now: float | None = None) -> None:
        if r.state == "completed":
            return
        now = now or time.time()
        if r.t_started is None:
            r.t_started = now
        r.state = "completed"
        r.t_completed = now
        r.work = None
        self.pending.discard(r)
        self.last_progress = now
        self.hang_dumped = False

    def fail(self, r: _Record, exc: BaseException) -> None:
        r.error = f"{type(exc).__name__}: {exc}"[:500]
        r.work = None
        self.pending.discard(r)

    def learn_peer(self, r: _Record, peer: int) -> None:
        any_key, key = (r.group, r.op, None), (r.group, r.op, peer)
        if self.p2p_seq.get(any_key) == r.p2p_seq:
            self.p2p_seq[any_key] -= 1
        r.peer = peer
        r.p2p_seq = self.p2p_seq.get(key, 0) + 1
        self.p2p_seq[key] = r.p2p_seq

    def poll_async(self) -> None:
        """Complete async records whose Work finished without anyone calling wait() (watchdog thread)."""
        for r in list(self.pending):
            work = r.work
            if work is not None:
                try:
                    if work.is_completed():
                        self.complete(r)
                except Exception:
                    r.work = None

    def _learn_group(self, pg) -> tuple[str, list[int], str]:
        c10d = _c10d
        name = str(c10d._get_process_group_name(pg))
        ranks = list(c10d.get_process_group_ranks(pg))
        desc = str(getattr(pg, "group_desc", "") or "")
        info = (name, ranks, desc)
        self.groups[pg] = info
        self.group_infos[name] = model.GroupInfo(name, ranks, False, desc)
        return info

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def activate(self) -> None:
        """A process group exists: remember who we are and start the watchdog and hooks (once)."""
        if self.active:
            return
        c10d = _c10d
        try:
            self.rank = c10d.get_rank()
            self.world_size = c10d.get_world_size()
            self._learn_group(c10d._world.default_pg)
        except Exception as exc:  # pragma: no cover - defensive; never break the job
            _warn(f"cannot read the process group ({exc}); recorder stays off")
            return
        self.active = True
        self.pid = os.getpid()
        self.last_progress = time.time()
        if not self._fork_hook_installed:  # a forked child (data loader worker) is not this rank: record nothing
            os.register_at_fork(after_in_child=self._after_fork_in_child)
            self._fork_hook_installed = True
        from distdoctor.trace.watchdog import Watchdog

        self.watchdog = Watchdog(self)
        self.watchdog.start()

    def _after_fork_in_child(self) -> None:
        self.active = False
        self.watchdog = None

    def deactivate(self) -> None:
        self.active = False
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None

    # ---- dumping -------------------------------------------------------------------------------------------
    def snapshot(self, reason: str, extra_stacks: dict | None = None) -> model.RankTrace:
        threads = {t.ident: t.name for t in threading.enumerate()}
        entries = [self._entry(r, threads) for r in list(self.buffer)]
        self._refresh_groups()
        stacks = None
        if self.config.stacks:
            skip = self.watchdog.ident if self.watchdog is not None else None
            stacks = all_thread_stacks(skip_ident=skip, trim_dir=_THIS_DIR + os.sep)
        if extra_stacks:  # e.g. the traceback of the exception that is ending a thread replaces its live stack
            stacks = {**(stacks or {}), **extra_stacks}
        return model.RankTrace(
            rank=self.rank if self.rank is not None else -1, source="native", version=str(model.NATIVE_VERSION),
            world_size=self.world_size, groups=dict(self.group_infos), entries=entries, stacks=stacks,
            dump_reason=reason, dump_time=time.time(), host=socket.gethostname(), pid=os.getpid())

    def _refresh_groups(self) -> None:
        """Every group this rank belongs to, used or not (the loaders then need no inference for ours)."""
        try:
            world = _c10d._world
            for pg, name in list(world.pg_names.items()):
                if pg not in self.groups:
                    self._learn_group(pg)
        except Exception:
            pass

    @staticmethod
    def _entry(r: _Record, threads: dict) -> model.Entry:
        return model.Entry(
            index=r.index, group=r.group, op=r.op, seq=r.seq, p2p_seq=r.p2p_seq, raw_op=r.raw_op,
            in_sizes=[list(s) for s in r.in_shapes], out_sizes=[list(s) for s in r.out_shapes],
            in_dtypes=[_dtype_name(d) for d in r.in_dtypes], out_dtypes=[_dtype_name(d) for d in r.out_dtypes],
            root=r.root, peer=r.peer, reduce_op=_reduce_name(r.reduce_op, r.op), state=r.state,
            t_created=r.t_created, t_started=r.t_started, t_completed=r.t_completed, async_op=r.async_op,
            stream=threads.get(r.thread, f"thread {r.thread}"),
            frames=[model.Frame(code.co_name, code.co_filename, _line_of(code, lasti))
                    for code, lasti in reversed(r.frames)],
            error=r.error)

    def dump_paths(self) -> tuple[str, str]:
        base = os.path.join(self.config.dump_dir, f"rank_{self.rank}")
        return base + ".jsonl", base + ".fr.pkl"

    def dump(self, reason: str, extra_stacks: dict | None = None) -> str | None:
        """Write rank_<r>.jsonl (and rank_<r>.fr.pkl when Flight Recorder is on). Never raises."""
        if self.rank is None or self.pid != os.getpid():
            return None  # never activated here, or a forked child that must not overwrite its parent's dump
        with self._dump_lock:
            if self._dumping:  # a signal arrived while this thread was already dumping
                return None
            self._dumping = True
            try:
                ensure_private_dir(self.config.dump_dir)
                path, fr_path = self.dump_paths()
                trace = self.snapshot(reason, extra_stacks)
                write_atomic(path, model.dumps(trace).encode())
                fr = flight_recorder_dump()
                if fr is not None:
                    write_atomic(fr_path, fr)
                self.dumps_written += 1
                return path
            except Exception as exc:
                _warn(f"dump to {self.config.dump_dir} failed: {type(exc).__name__}: {exc}")
                return None
            finally:
                self._dumping = False


def flight_recorder_dump() -> bytes | None:
    """Flight Recorder's own pickle dump, when this torch has it and it is switched on.

    Without FR's stack traces unless DISTDOCTOR_FR_STACKS=1: symbolizing them costs 5-12 s on the first dump
    (measured here, torch 2.13 CPU), which would delay a crashing process's exit, and our own entries already
    carry the Python frames of each call.
    """
    stacks = os.environ.get("DISTDOCTOR_FR_STACKS", "0") == "1"
    if _env_number("TORCH_FR_BUFFER_SIZE", int, 0) <= 0 and _env_number("TORCH_NCCL_TRACE_BUFFER_SIZE", int, 0) <= 0:
        return None
    try:
        import torch

        c = torch._C._distributed_c10d
        if hasattr(c, "_dump_fr_trace"):
            return bytes(c._dump_fr_trace(True, stacks, False))
        if hasattr(c, "_dump_nccl_trace"):
            return bytes(c._dump_nccl_trace(True, stacks, False))
    except Exception as exc:
        _warn(f"Flight Recorder dump failed: {type(exc).__name__}: {exc}")
    return None


# ---- patching ----------------------------------------------------------------------------------------------

_recorder: Recorder | None = None
_c10d = None
_SKIP_FILES: set[str] = set()  # frames in these files are torch's or ours, not the caller's
_originals: dict[str, object] = {}
_tls = threading.local()
_patch_lock = threading.Lock()


def _make_wrapper(raw: str, orig, op: str, describer, is_p2p: bool):
    @functools.wraps(orig)
    def traced(*args, **kwargs):
        rec = _recorder
        if rec is None or not rec.active or getattr(_tls, "busy", False):
            return orig(*args, **kwargs)
        _tls.busy = True
        try:
            try:
                record = rec.begin(raw, op, describer(*args, **kwargs), is_p2p)
            except Exception:
                record = None  # odd arguments: let torch raise its own error
            try:
                result = orig(*args, **kwargs)
            except BaseException as exc:
                if record is not None:
                    rec.fail(record, exc)
                raise
        finally:
            _tls.busy = False
        if record is None:
            return result
        if record.async_op and result is not None:
            record.state = "started"
            record.t_started = time.time()
            record.work = result
            return _traced_work(result, (record,), rec)
        if is_p2p and record.peer is None and isinstance(result, int):
            rec.learn_peer(record, result)  # recv from any source: torch tells us who sent
        # rec.complete(record), inlined: this is the common path
        record.t_completed = rec.last_progress = time.time()
        record.state = "completed"
        rec.pending.discard(record)
        rec.hang_dumped = False
        return result

    traced._distdoctor_original = orig
    return traced


def _make_batch_wrapper(orig):
    @functools.wraps(orig)
    def traced(p2p_op_list):
        rec = _recorder
        if rec is None or not rec.active or getattr(_tls, "busy", False):
            return orig(p2p_op_list)
        _tls.busy = True
        try:
            records = []
            try:
                for p in p2p_op_list:
                    if getattr(p.op, "_distdoctor_original", None) is None:
                        p.op = _c10d.isend if p.op is _originals.get("isend") else (
                            _c10d.irecv if p.op is _originals.get("irecv") else p.op)
                    desc = describe_p2p_op(p)
                    r = rec.begin("batch_isend_irecv:" + ("isend" if desc.direction == "send" else "irecv"),
                                  desc.direction, desc, True)
                    if r is not None:
                        records.append(r)
            except Exception:
                pass
            try:
                works = orig(p2p_op_list)
            except BaseException as exc:
                for r in records:
                    rec.fail(r, exc)
                raise
        finally:
            _tls.busy = False
        if not records or not works:
            return works
        now = time.time()
        for r in records:
            r.state, r.t_started = "started", now
        if len(works) == len(records):
            for r, w in zip(records, works):
                r.work = w
            return [_traced_work(w, (r,), rec) for r, w in zip(records, works)]
        for r in records:  # coalesced: one Work stands for the whole batch
            r.work = works[0]
        return [_traced_work(w, tuple(records), rec) for w in works]

    traced._distdoctor_original = orig
    return traced


_TracedWork = None


def _traced_work(inner, records, rec):
    global _TracedWork
    if _TracedWork is None:
        _TracedWork = _define_traced_work()
    return _TracedWork(inner, records, rec)


def _define_traced_work():
    Work = _c10d.Work

    class TracedWork(Work):
        """A Work that completes its trace records when waited on; everything else goes to the real Work."""

        def __init__(self, inner, records, recorder):
            super().__init__()
            self._inner, self._records, self._recorder = inner, records, recorder

        def _done(self):
            now = time.time()
            for r in self._records:
                self._recorder.complete(r, now)

        def wait(self, *args, **kwargs):
            result = self._inner.wait(*args, **kwargs)
            self._done()
            return result

        def is_completed(self):
            done = self._inner.is_completed()
            if done:
                self._done()
            return done

        def get_future(self):
            return self._inner.get_future()

        def exception(self):
            return self._inner.exception()

        def is_success(self):
            return self._inner.is_success()

        def result(self):
            return self._inner.result()

        def source_rank(self):
            return self._inner.source_rank()

        def _source_rank(self):
            return self._inner._source_rank()

        def synchronize(self):
            result = self._inner.synchronize()
            self._done()
            return result

        def boxed(self):
            return self._inner.boxed()

        def __getattr__(self, name):
            return getattr(self._inner, name)

    for name in ("get_future_result", "block_current_stream", "_get_duration", "_get_op_type"):
        if hasattr(Work, name):
            setattr(TracedWork, name, (lambda n: lambda self, *a, **k: getattr(self._inner, n)(*a, **k))(name))
    return TracedWork


def _make_init_wrapper(orig):
    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        if _recorder is not None:
            _recorder.activate()
        return result

    init_process_group._distdoctor_original = orig
    return init_process_group


def _make_destroy_wrapper(orig):
    @functools.wraps(orig)
    def destroy_process_group(group=None):
        rec = _recorder
        if rec is not None and (group is None or group is _c10d._world.default_pg):
            rec.deactivate()
        if rec is not None:
            rec.groups.clear()  # do not keep destroyed process groups alive
        return orig(group)

    destroy_process_group._distdoctor_original = orig
    return destroy_process_group


def _check_op(op) -> None:
    ok = [_c10d.isend, _c10d.irecv, _originals.get("isend"), _originals.get("irecv")]
    if op not in ok:
        raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                         "``torch.distributed.irecv``.")


def _patch() -> None:
    """Replace the torch.distributed functions with recording wrappers (idempotent)."""
    global _c10d
    with _patch_lock:
        if _originals:
            return
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        _c10d = c10d
        from distdoctor.trace import describe

        _SKIP_FILES.update({c10d.__file__, __file__, describe.__file__})
        wrappers = {}
        for name, (op, describer, is_p2p) in DESCRIBERS.items():
            if hasattr(c10d, name):
                wrappers[name] = _make_wrapper(name, getattr(c10d, name), op, describer, is_p2p)
        for name, factory in (("batch_isend_irecv", _make_batch_wrapper),
                              ("init_process_group", _make_init_wrapper),
                              ("destroy_process_group", _make_destroy_wrapper)):
            if hasattr(c10d, name):
                wrappers[name] = factory(getattr(c10d, name))
        if hasattr(c10d, "_check_op"):
            wrappers["_check_op"] = _check_op
        for name, wrapper in wrappers.items():
            orig = getattr(c10d, name)
            _originals[name] = orig
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is orig:
                setattr(dist, name, wrapper)


def _unpatch() -> None:
    with _patch_lock:
        if not _originals:
            return
        import torch.distributed as dist

        for name, orig in _originals.items():
            wrapper = getattr(_c10d, name)
            setattr(_c10d, name, orig)
            if getattr(dist, name, None) is wrapper:
                setattr(dist, name, orig)
        _originals.clear()


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches torch.distributed right after it is first imported, so enabling costs nothing until then."""

    def find_spec(self, name, path, target=None):
        if name != "torch.distributed":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _remove_import_hook()
            try:
                _patch()
            except Exception as exc:  # never break `import torch`
                _warn(f"cannot patch torch.distributed ({type(exc).__name__}: {exc}); recorder stays off")

        loader.exec_module = exec_then_patch
        return spec


_import_hook = _PatchOnImport()


def _remove_import_hook() -> None:
    try:
        sys.meta_path.remove(_import_hook)
    except ValueError:
        pass


# ---- public API --------------------------------------------------------------------------------------------

def enable(dump_dir=None, hang_timeout=None, buffer_size=None, stacks=None, dump_on_exit=None) -> Recorder:
    """Start recording in this process (idempotent; a second call updates the settings given)."""
    global _recorder
    config = RecorderConfig.resolve(dump_dir, hang_timeout, buffer_size, stacks, dump_on_exit)
    if _recorder is not None:
        old = _recorder.config
        _recorder.config = RecorderConfig(
            config.dump_dir if dump_dir is not None else old.dump_dir,
            config.hang_timeout if hang_timeout is not None else old.hang_timeout,
            old.buffer_size, config.stacks if stacks is not None else old.stacks,
            config.dump_on_exit if dump_on_exit is not None else old.dump_on_exit, old.frames)
        return _recorder
    _recorder = Recorder(config)
    dist = sys.modules.get("torch.distributed")
    initialized = bool(dist is not None and hasattr(dist, "is_initialized") and dist.is_available()
                       and dist.is_initialized())
    if not initialized and "TORCH_FR_BUFFER_SIZE" not in os.environ:
        os.environ["TORCH_FR_BUFFER_SIZE"] = str(config.buffer_size)  # read when the process group is created
    if dist is not None and hasattr(dist, "init_process_group"):
        _patch()
    elif _import_hook not in sys.meta_path:
        sys.meta_path.insert(0, _import_hook)
    if initialized:
        _recorder.activate()
    return _recorder


def disable() -> None:
    """Stop recording and restore torch.distributed's functions. The buffer is dropped."""
    global _recorder
    rec, _recorder = _recorder, None
    _remove_import_hook()
    if rec is not None:
        rec.deactivate()
    _unpatch()


def dump(reason: str = "manual") -> str | None:
    """Write this rank's dump now; returns its path (None when the recorder is off or no group exists)."""
    rec = _recorder
    return rec.dump(f"manual: {reason}" if reason != "manual" else reason) if rec is not None else None


def get_recorder() -> Recorder | None:
    return _recorder
