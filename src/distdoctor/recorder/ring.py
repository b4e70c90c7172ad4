"""The in-process recorder: every torch.distributed collective and p2p call into a bounded per-rank ring buffer.

How it records. `enable()` has patch.py replace the public functions of `torch.distributed.distributed_c10d`
with thin wrappers. A wrapper binds the call's arguments with a describer (distdoctor.recorder.describe),
appends one small `_Record` (slots; shapes and dtypes, never tensors; caller frames as (code, line) pairs,
formatted only at dump time) to a `deque(maxlen=buffer_size)`, calls the original, and marks the record
completed (and keeps how long it took, for the adaptive hang threshold). Async calls return a `TracedWork`
whose wait()/is_completed() complete the record; the watchdog also polls pending async works. No I/O and no
locks on the hot path.

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

The recorder becomes active in a process only when a process group exists (init_process_group is wrapped;
enable() finds one; or the first collective finds one made through an unwrapped reference, as
init_device_mesh does): only then do the watchdog, signal and exception hooks start. That keeps it harmless in
processes that merely import torch, such as the torchrun agent. When to dump is the watchdog's business
(watchdog.py, hangwatch.py); this module writes the dump.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
import os
import socket
import sys
import threading
import time
from collections import deque

from distdoctor.recorder import creations, layout, patch
from distdoctor.recorder.config import RecorderConfig, warn
from distdoctor.recorder.describe import Call
from distdoctor.recorder.dumpfile import (FR_JSON_DIR, all_thread_stacks, apply_standing, ensure_private_dir,
                                         flight_recorder_dump, flight_recorder_json, fr_standing, write_atomic)
from distdoctor.trace import model

WAITS_KEPT = 256  # completed collectives whose wait times set the adaptive threshold
_THIS_DIR = os.path.dirname(os.path.abspath(__file__))
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


class _Record:
    __slots__ = ("index", "group", "op", "raw_op", "seq", "p2p_seq", "in_shapes", "in_dtypes", "out_shapes",
                 "out_dtypes", "root", "peer", "reduce_op", "state", "t_created", "t_started", "t_completed",
                 "async_op", "thread", "frames", "error", "work")


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _reduce_name(op, name: str) -> str | None:
    if op is None:  # torch's default; imported here, at dump time, to keep the recorder's start-up light
        from distdoctor.collectives import reduces

        return "sum" if reduces(name) else None
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
        self.creations: deque[tuple[dict, list]] = deque(maxlen=creations.MAX_KEPT)  # new_group & co (lint)
        self._creation_index = itertools.count()
        self._index = itertools.count()
        self.last_progress = time.time()  # last collective issued or completed here
        self.waits: deque[float] = deque(maxlen=WAITS_KEPT)  # how long recent collectives took (hangwatch.py)
        self.active = False
        self.rank: int | None = None
        self.world_size: int | None = None
        self.dumps_written = 0
        self.final_dump_reason: str | None = None
        self.exception: dict | None = None  # the uncaught exception ending this rank (dump header)
        self.last_trace: model.RankTrace | None = None  # the last dump written, for header-only rewrites
        self.after_dump = None  # the watchdog's hook: a SIGTERM that arrived mid-dump ends the process now
        self._dump_lock = threading.RLock()
        self._dumping = False
        self._dump_thread: int | None = None
        self.watchdog = None
        self.pid: int | None = None
        self.forked = False
        self._fork_hook_installed = False

    # ---- hot path ------------------------------------------------------------------------------------------
    def begin(self, raw: str, op: str, call: Call, is_p2p: bool) -> _Record | None:
        c10d = patch.c10d
        pg = call.group if call.group is not None else c10d._world.default_pg
        if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER:
            return None  # torch returns without communicating; nothing to record
        info = self.groups.get(pg)
        if info is None:
            info = self._learn_group(pg)
        name, ranks, _ = info
        r = _Record()
        now = time.time()
        self.last_progress = now  # first: the watchdog thread must never see this call counted (seq) but not dated
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
        r.frames = patch.caller_frames(sys._getframe(2), self.config.frames) if self.config.frames else []
        self.buffer.append(r)
        self.pending.add(r)
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
        self.waits.append(now - r.t_created)

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
        c10d = patch.c10d
        name = str(c10d._get_process_group_name(pg))
        ranks = list(c10d.get_process_group_ranks(pg))
        desc = str(getattr(pg, "group_desc", "") or "")
        info = (name, ranks, desc)
        self.groups[pg] = info
        self.group_infos[name] = model.GroupInfo(name, ranks, False, desc)
        return info

    def record_creation(self, info: dict, frames: list) -> None:
        """A process group or DeviceMesh was created (recorder/creations.py); frames as caller_frames gives."""
        self.creations.append(({**info, "index": next(self._creation_index)}, frames))

    def _creations(self) -> list[dict] | None:
        return [{**info, "frames": [{"name": code.co_name, "filename": code.co_filename,
                                     "line": _line_of(code, lasti)} for code, lasti in reversed(frames)]}
                for info, frames in list(self.creations)] or None

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def activate(self) -> None:
        """A process group exists: remember who we are and start the watchdog and hooks (once)."""
        if self.active:
            return
        c10d = patch.c10d
        try:
            self.rank = c10d.get_rank()
            self.world_size = c10d.get_world_size()
            self._learn_group(c10d._world.default_pg)
        except Exception as exc:  # pragma: no cover - defensive; never break the job
            warn(f"cannot read the process group ({exc}); recorder stays off")
            return
        self.active = True
        self.pid = os.getpid()
        self.last_progress = time.time()
        if not self._fork_hook_installed:  # a forked child (data loader worker) is not this rank: record nothing
            os.register_at_fork(after_in_child=self._after_fork_in_child)
            self._fork_hook_installed = True
        from distdoctor.recorder.watchdog import Watchdog

        self.watchdog = Watchdog(self)
        self.watchdog.start()
        from distdoctor.recorder import live

        live.start(self)  # serve this rank's state through torch's worker server (recorder/live.py)

    def _after_fork_in_child(self) -> None:
        self.active = False
        self.forked = True
        self.watchdog = None

    def activate_late(self) -> bool:
        """A process group made through a reference to init_process_group taken before we patched it
        (torch.distributed.device_mesh does that): notice it at the first collective and come alive then."""
        c10d = patch.c10d
        if self.forked or c10d is None or c10d._world.default_pg is None:
            return False
        self.activate()
        return self.active

    def deactivate(self) -> None:
        self.active = False
        if self.watchdog is not None:
            self.watchdog.stop()
            self.watchdog = None

    def group_alive(self) -> bool:
        """False once the default process group is gone (destroyed through a reference we did not wrap)."""
        c10d = patch.c10d
        return c10d is None or c10d._world.default_pg is not None

    def pending_summary(self) -> str:
        pending = sorted(list(self.pending), key=lambda r: r.index)
        if not pending:
            return "no collective pending"
        first = pending[0]
        where = f"seq {first.seq}" if first.seq is not None else f"peer {first.peer}"
        return f"{len(pending)} pending, oldest {first.op} on group {first.group} {where}"

    def at_destroy(self) -> None:
        """destroy_process_group() of the whole job: its end the normal way. Dump now, while the group and
        Flight Recorder still exist, when a collective is still pending or dump_on_exit asks for it (the exit
        hook that would otherwise do it is removed with the watchdog)."""
        if self.final_dump_reason is not None:
            return
        if self.pending:
            reason = f"exit: process group destroyed with {self.pending_summary()}"
        elif self.config.dump_on_exit:
            reason = "exit: normal exit (destroy_process_group)"
        else:
            return
        self.final_dump_reason = reason
        self.dump(reason)

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
        hang = self.watchdog.hang_header() if self.watchdog is not None else None
        trace = model.RankTrace(
            rank=self.rank if self.rank is not None else -1, source="native", version=str(model.NATIVE_VERSION),
            world_size=self.world_size, groups=dict(self.group_infos), entries=entries, stacks=stacks,
            dump_reason=reason, dump_time=time.time(), host=socket.gethostname(), pid=os.getpid(), hang=hang,
            exception=self.exception, group_creations=self._creations())
        apply_standing(trace, fr_standing())  # NCCL: completed means the GPU completed it
        return trace

    def _refresh_groups(self) -> None:
        """Every group this rank belongs to, used or not (the loaders then need no inference for ours)."""
        try:
            world = patch.c10d._world
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

    def rank_dir(self) -> str:
        """Where this rank's files go: the dump directory, or its host's subdirectory (recorder/layout.py)."""
        chosen = layout.resolve(self.config.layout, self.world_size)
        return layout.rank_dir(self.config.dump_dir, chosen, socket.gethostname())

    def dump_paths(self) -> tuple[str, str]:
        base = os.path.join(self.rank_dir(), f"rank_{self.rank}")
        return base + ".jsonl", base + ".fr.pkl"

    def dump(self, reason: str, extra_stacks: dict | None = None) -> str | None:
        """Write rank_<r>.jsonl (and rank_<r>.fr.pkl when Flight Recorder is on). Never raises.

        One dump at a time: another thread waits for the one in progress (then writes its own); a signal
        handler running on the dumping thread itself returns at once (the watchdog defers a SIGTERM that
        arrives mid-dump until the dump is on disk: see watchdog.py)."""
        if self.rank is None or self.pid != os.getpid():
            return None  # never activated here, or a forked child that must not overwrite its parent's dump
        path = None
        with self._dump_lock:
            if self._dumping:  # a signal arrived while this thread was already dumping
                return None
            self._dumping, self._dump_thread = True, threading.get_ident()
            try:
                ensure_private_dir(self.config.dump_dir)
                path, fr_path = self.dump_paths()
                ensure_private_dir(os.path.dirname(path))
                trace = self.snapshot(reason, extra_stacks)
                write_atomic(path, model.dumps(trace).encode())
                self.last_trace = trace
                fr = flight_recorder_dump()
                if fr is not None:
                    write_atomic(fr_path, fr)
                fr_json = flight_recorder_json()
                if fr_json is not None:
                    json_dir = os.path.join(os.path.dirname(path), FR_JSON_DIR)
                    ensure_private_dir(json_dir)
                    write_atomic(os.path.join(json_dir, f"rank_{self.rank}.fr.json"), fr_json)
                self.dumps_written += 1
            except Exception as exc:
                warn(f"dump to {self.config.dump_dir} failed: {type(exc).__name__}: {exc}")
                path = None
            finally:
                self._dumping, self._dump_thread = False, None
        if self.after_dump is not None:
            self.after_dump()
        return path

    def dumping_here(self) -> bool:
        """This thread is in the middle of a dump (a signal handler interrupted it)."""
        return self._dumping and self._dump_thread == threading.get_ident()

    def rewrite_header(self, reason: str, hang: dict | None) -> bool:
        """Rewrite the last dump with a new reason and hang status, keeping its entries and stacks (the picture
        at that moment): how a suspected hang that resumed is recorded without a fresh, mid-run snapshot."""
        with self._dump_lock:
            trace = self.last_trace
            if trace is None or self._dumping or self.pid != os.getpid():
                return False
            trace.dump_reason, trace.hang = reason, hang
            try:
                write_atomic(self.dump_paths()[0], model.dumps(trace).encode())
                return True
            except Exception as exc:
                warn(f"dump to {self.config.dump_dir} failed: {type(exc).__name__}: {exc}")
                return False


# ---- public API --------------------------------------------------------------------------------------------

def enable(dump_dir=None, hang_timeout=None, buffer_size=None, stacks=None, dump_on_exit=None,
           suspect_floor=None, suspect_factor=None, start_timeout=None) -> Recorder:
    """Start recording in this process (idempotent; a second call updates the settings given)."""
    config = RecorderConfig.resolve(dump_dir, hang_timeout, buffer_size, stacks, dump_on_exit, suspect_floor,
                                    suspect_factor, start_timeout)
    rec = patch.current
    if rec is not None:
        old = rec.config
        given = {"dump_dir": dump_dir, "hang_timeout": hang_timeout, "stacks": stacks, "dump_on_exit": dump_on_exit,
                 "suspect_floor": suspect_floor, "suspect_factor": suspect_factor, "start_timeout": start_timeout}
        rec.config = dataclasses.replace(old, **{k: getattr(config, k) for k, v in given.items() if v is not None})
        return rec
    rec = patch.current = Recorder(config)
    dist = sys.modules.get("torch.distributed")
    initialized = bool(dist is not None and hasattr(dist, "is_initialized") and dist.is_available()
                       and dist.is_initialized())
    if not initialized and "TORCH_FR_BUFFER_SIZE" not in os.environ:
        os.environ["TORCH_FR_BUFFER_SIZE"] = str(config.buffer_size)  # read when the process group is created
    if dist is not None and hasattr(dist, "init_process_group"):
        patch.patch()
    elif patch.import_hook not in sys.meta_path:
        sys.meta_path.insert(0, patch.import_hook)
    if initialized:
        rec.activate()
    return rec


def disable() -> None:
    """Stop recording and restore torch.distributed's functions. The buffer is dropped."""
    rec, patch.current = patch.current, None
    patch.remove_import_hook()
    if rec is not None:
        rec.deactivate()
    patch.unpatch()


def dump(reason: str = "manual") -> str | None:
    """Write this rank's dump now; returns its path (None when the recorder is off or no group exists)."""
    rec = patch.current
    return rec.dump(f"manual: {reason}" if reason != "manual" else reason) if rec is not None else None


def get_recorder() -> Recorder | None:
    return patch.current
