"""Patching torch.distributed: the recording wrappers, the traced Work, and the import hook.

`patch()` replaces the public collective and p2p functions of `torch.distributed.distributed_c10d` (and the
same names re-exported by `torch.distributed`) with thin wrappers that record into `current`, the Recorder
that `recorder.enable()` installs (see ring.py for what a record holds). Async calls return a
`TracedWork`, a `Work` subclass delegating to the real one, whose wait()/is_completed() complete the record.
A thread-local guard keeps nested calls (all_gather_object -> all_gather, batch_isend_irecv -> isend) from
being recorded twice: the outermost call wins, except for the object collectives, which are not wrapped, so
their inner tensor collectives are recorded with the same sequence numbers Flight Recorder gives them.
`init_process_group` and `destroy_process_group` are wrapped to bring the recorder alive and to dump (with
dump_on_exit) and stop it when the job ends the normal way. The import hook patches torch.distributed right
after its first import, so enabling costs nothing until then.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
import threading
import time

from distdoctor.recorder import creations
from distdoctor.recorder.config import INJECT_ENV
from distdoctor.recorder.describe import DESCRIBERS, describe_p2p_op
from distdoctor.trace.code_origin import is_library

current = None  # the Recorder the wrappers record into (set by recorder.enable)
c10d = None  # torch.distributed.distributedc10d, once patched
SKIP_FILES: set[str] = set()  # frames in these files are torch's or ours, not the caller's
_originals: dict[str, object] = {}
_tls = threading.local()
_patch_lock = threading.Lock()
LIBRARY_FRAMES = 2  # torch's innermost frames kept per call, beside the caller's own
FRAMES_WALKED = 64
_library_code: dict = {}  # code object -> whether it is library code (trace.code_origin): looked up once each


def caller_frames(f, wanted: int) -> list:
    """(code, instruction offset) pairs from frame `f` outwards: the caller's innermost `wanted` frames outside
    torch (a library such as FSDP or pipelining calls in from deep inside torch: its frames alone would never
    name the user's line) and the innermost LIBRARY_FRAMES of torch's own (which API called in), never those in
    SKIP_FILES; FRAMES_WALKED frames at most. Line numbers are looked up at dump time (f_lineno costs more)."""
    out: list = []
    library_left = LIBRARY_FRAMES
    for _ in range(FRAMES_WALKED):
        if f is None or not wanted:
            break
        code = f.f_code
        if code.co_filename not in SKIP_FILES:
            library = _library_code.get(code)
            if library is None:
                library = _library_code[code] = is_library(code.co_filename)
            if not library:
                out.append((code, f.f_lasti))
                wanted -= 1
            elif library_left:
                out.append((code, f.f_lasti))
                library_left -= 1
        f = f.f_back
    return out


def _make_wrapper(raw: str, orig, op: str, describer, is_p2p: bool):
    @functools.wraps(orig)
    def traced(*args, **kwargs):
        rec = current
        if rec is None or getattr(_tls, "busy", False) or not (rec.active or rec.activate_late()):
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
        rec.waits.append(record.t_completed - record.t_created)
        return result

    traced._distdoctor_original = orig
    return traced


def _make_batch_wrapper(orig):
    @functools.wraps(orig)
    def traced(p2p_op_list):
        rec = current
        if rec is None or getattr(_tls, "busy", False) or not (rec.active or rec.activate_late()):
            return orig(p2p_op_list)
        _tls.busy = True
        try:
            records = []
            try:
                for p in p2p_op_list:
                    if getattr(p.op, "_distdoctor_original", None) is None:
                        p.op = c10d.isend if p.op is _originals.get("isend") else (
                            c10d.irecv if p.op is _originals.get("irecv") else p.op)
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
    Work = c10d.Work

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
            if name == "_inner":  # not set yet (e.g. while copying): never recurse
                raise AttributeError(name)
            return getattr(self._inner, name)

    for name in ("get_future_result", "block_current_stream", "_get_duration", "_get_op_type"):
        if hasattr(Work, name):
            setattr(TracedWork, name, (lambda n: lambda self, *a, **k: getattr(self._inner, n)(*a, **k))(name))
    return TracedWork


def _make_init_wrapper(orig):
    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        result = orig(*args, **kwargs)
        if current is not None:
            current.activate()
        return result

    init_process_group._distdoctor_original = orig
    return init_process_group


def _make_destroy_wrapper(orig):
    @functools.wraps(orig)
    def destroy_process_group(group=None):
        rec = current
        whole = group is None or group is c10d._world.default_pg
        if rec is not None and whole and rec.active:
            rec.at_destroy()  # the job ends the normal way: the exit dump, while the group still exists
        result = orig(group)
        if rec is not None:
            if whole:
                rec.deactivate()
            rec.groups.clear()  # do not keep destroyed process groups alive
        return result

    destroy_process_group._distdoctor_original = orig
    return destroy_process_group


def _check_op(op) -> None:
    ok = [c10d.isend, c10d.irecv, _originals.get("isend"), _originals.get("irecv")]
    if op not in ok:
        raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed.isend`` or "
                         "``torch.distributed.irecv``.")


def patch() -> None:
    """Replace the torch.distributed functions with recording wrappers (idempotent)."""
    global c10d
    with _patch_lock:
        if _originals:
            return
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as module

        c10d = module
        from distdoctor.collectives import canonical_op
        from distdoctor.recorder import describe

        SKIP_FILES.update({c10d.__file__, __file__, describe.__file__})
        wrappers = {}
        for name, (describer, is_p2p) in DESCRIBERS.items():
            if hasattr(c10d, name):
                wrappers[name] = _make_wrapper(name, getattr(c10d, name), canonical_op(name), describer, is_p2p)
        for name, factory in (("batch_isend_irecv", _make_batch_wrapper),
                              ("init_process_group", _make_init_wrapper),
                              ("destroy_process_group", _make_destroy_wrapper)):
            if hasattr(c10d, name):
                wrappers[name] = factory(getattr(c10d, name))
        if hasattr(c10d, "_check_op"):
            wrappers["_check_op"] = _check_op
        if os.environ.get(INJECT_ENV):  # a drill (`distdoctor run --inject`): faults planted here
            from distdoctor.recorder import inject

            inject.install(c10d, wrappers, DESCRIBERS, lambda: current)
        for name, wrapper in wrappers.items():
            orig = getattr(c10d, name)
            _originals[name] = orig
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is orig:
                setattr(dist, name, wrapper)
        creations.install(c10d, dist, sys.modules[__name__])  # new_group, init_device_mesh, ...: lint reads them


def unpatch() -> None:
    with _patch_lock:
        if not _originals:
            return
        import torch.distributed as dist

        creations.uninstall()
        for name, orig in _originals.items():
            wrapper = getattr(c10d, name)
            setattr(c10d, name, orig)
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
            remove_import_hook()
            try:
                patch()
            except Exception as exc:  # never break `import torch`
                print(f"distdoctor.recorder: warning: cannot patch torch.distributed ({type(exc).__name__}: {exc}); recorder stays off",
                      file=sys.stderr, flush=True)

        loader.exec_module = exec_then_patch
        return spec


import_hook = _PatchOnImport()


def remove_import_hook() -> None:
    try:
        sys.meta_path.remove(import_hook)
    except ValueError:
        pass


