"""Writing dump files: atomically, owner-only, and the Python stacks of every thread.

Atomic write: the bytes go to a hidden temporary file in the same directory (`.rank_3.jsonl.tmp-<pid>-<n>`,
created O_EXCL with mode 0600), are fsync'ed, then `os.replace`d over the final name and the directory is
fsync'ed. A reader therefore sees either the previous complete dump or the new complete one, never a torn file,
even if the process is killed mid-write; a killed writer can leave only a hidden `.tmp-` file behind.
A directory we create is 0700: dumps carry file paths, host names and stack traces. Flight Recorder's own dump
is taken here too.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import traceback

from distdoctor.trace.frontier import read_pg_status
from distdoctor.trace.model import Frame

_tmp_counter = itertools.count()
MAX_STACK_DEPTH = 64


def ensure_private_dir(path: str) -> None:
    """Create `path` (and parents) if missing; a directory we create gets mode 0700."""
    if os.path.isdir(path):
        return
    os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        os.chmod(path, 0o700)
    except OSError:
        pass


def temp_name(path: str) -> str:
    directory, base = os.path.split(path)
    return os.path.join(directory, f".{base}.tmp-{os.getpid()}-{next(_tmp_counter)}")


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write `data` to `path` so that no reader ever sees a partial file."""
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename itself is still atomic


def fr_enabled() -> bool:
    """Flight Recorder records (TORCH_FR_BUFFER_SIZE, or its older name, is positive)."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        try:
            if int(os.environ.get(name, "0") or 0) > 0:
                return True
        except ValueError:
            pass
    return False


def _uses_nccl() -> bool:
    """A process group of this job speaks NCCL: its calls are in NCCL's Flight Recorder (with `pg_status`), not
    in the one Gloo and the other CPU backends share."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return False
        backends = {str(dist.get_backend(pg)).lower() for pg in getattr(dist.distributed_c10d, "_world").pg_map}
        return any("nccl" in b for b in backends)
    except Exception:
        return False


def fr_dumper(form: str):
    """The function of torch that dumps this job's Flight Recorder in `form` ("pickle" or "json"), or None.

    torch keeps two recorders: NCCL's (`_dump_nccl_trace*`, which also holds each group's `pg_status`: what its
    CPU enqueued and its GPU started and completed) and the one Gloo and other CPU backends share
    (`_dump_fr_trace*`). A job with an NCCL group is read from NCCL's."""
    try:
        import torch

        c = torch._C._distributed_c10d
    except Exception:
        return None
    suffix = "_json" if form == "json" else ""
    names = [f"_dump_fr_trace{suffix}", f"_dump_nccl_trace{suffix}"]
    if _uses_nccl():
        names.reverse()
    return next((getattr(c, n) for n in names if hasattr(c, n)), None)


def flight_recorder_dump() -> bytes | None:
    """Flight Recorder's own pickle dump, when this torch has it and it is switched on.

    Without FR's stack traces unless DISTDOCTOR_FR_STACKS=1: symbolizing them costs 5-12 s on the first dump
    (measured here, torch 2.13 CPU), which would delay a crashing process's exit, and our own entries already
    carry the Python frames of each call.
    """
    if not fr_enabled():
        return None
    stacks = os.environ.get("DISTDOCTOR_FR_STACKS", "0") == "1"
    try:
        dump = fr_dumper("pickle")
        if dump is not None:
            return bytes(dump(True, stacks, False))
    except Exception as exc:
        print(f"distdoctor.recorder: warning: Flight Recorder dump failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
    return None


def fr_standing() -> dict | None:
    """Where this rank's communicators stand, from its own Flight Recorder (its `pg_status` and entries):
    {"pg_status", "pg_names" (pg_id -> group name, from the entries), "active", "comm_lib_version"}. None
    without Flight Recorder. Every entry Flight Recorder keeps is read (a few ms for 2000): the completed ones
    name the groups with nothing in flight.

    Under any backend the frontier numbers the calls the recorder cannot see (issued from C++): a trace whose
    Flight Recorder dump is lost still says which of its group's calls this rank never issued
    (trace/loaders/align_ranks.py). Under NCCL (`comm_lib_version` set) it also says where the GPU stands:
    "active" maps (group, seq) to the entry's state for collectives its GPU has not completed, and the
    recorder's own records (a Python call returned when its CPU enqueued it) take their completion from there
    (apply_standing). Under Gloo a call returns when it is done: "active" is empty."""
    if not fr_enabled():
        return None
    nccl = _uses_nccl()
    try:
        got = json.loads(fr_dumper("json")(True, False))
    except Exception:
        return None
    entries = [e for e in got.get("entries") or [] if isinstance(e, dict)]
    names = {str(e["pg_id"]): str(e["process_group"][0]) for e in entries
             if e.get("pg_id") is not None and e.get("process_group")}
    active = {(str(e["process_group"][0]), int(e.get("collective_seq_id") or 0)): str(e.get("state") or "scheduled")
              for e in entries if nccl and e.get("process_group") and not e.get("is_p2p") and not e.get("retired")}
    lib = (got.get("nccl_version") or got.get("comm_lib_version") or "nccl") if nccl else None
    return {"pg_status": got.get("pg_status"), "pg_names": names, "active": active, "comm_lib_version": lib}


_GPU_STATE = {"scheduled": "issued", "started": "started"}


def apply_standing(trace, standing: dict | None) -> None:
    """The recorder's trace of this rank with its communicators' frontiers (see fr_standing); under NCCL, in
    its terms: a collective whose Python call returned is completed only if its GPU completed it."""
    if not standing:
        return
    trace.pg_status = read_pg_status(standing["pg_status"])
    trace.pg_names = standing["pg_names"] or None
    trace.comm_lib_version = str(standing["comm_lib_version"]) if standing["comm_lib_version"] else None
    active = standing["active"]
    for e in trace.entries if active else ():
        gpu = active.get((e.group, e.seq)) if e.seq is not None and not e.is_p2p else None
        if gpu is not None and e.error is None and e.state == "completed":
            e.state = _GPU_STATE.get(gpu, "issued")


FR_JSON_DIR = ".fr-json"  # DISTDOCTOR_FR_JSON=1: Flight Recorder's JSON form too, hidden (one form per set)


def flight_recorder_json() -> bytes | None:
    """Flight Recorder's JSON dump (torch's `_dump_fr_trace_json`, NCCL's `_dump_nccl_trace_json`), when
    DISTDOCTOR_FR_JSON=1 asks for it too: the same trace in the form torch writes for NCCL's JSON dumps, kept apart
    from the pickle (FR_JSON_DIR) so a dump directory holds one form of each rank."""
    if os.environ.get("DISTDOCTOR_FR_JSON", "0") != "1" or not fr_enabled():
        return None
    try:
        dump = fr_dumper("json")
        if dump is not None:
            out = dump(True, False)
            return out.encode() if isinstance(out, str) else bytes(out)
    except Exception as exc:
        print(f"distdoctor.recorder: warning: Flight Recorder JSON dump failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
    return None


def frames_of(frame, limit: int = MAX_STACK_DEPTH) -> list[Frame]:
    """The stack ending at `frame`, innermost last (like a traceback)."""
    out = []
    for summary in traceback.extract_stack(frame, limit=limit):
        out.append(Frame(summary.name, summary.filename, summary.lineno or 0))
    return out


def frames_of_traceback(tb, limit: int = MAX_STACK_DEPTH) -> list[Frame]:
    return [Frame(s.name, s.filename, s.lineno or 0) for s in traceback.extract_tb(tb, limit=limit)]


DRILL_FILE = os.sep + "inject.py"  # the recorder's drills (recorder/inject.py)


def all_thread_stacks(skip_ident: int | None = None, trim_dir: str | None = None) -> dict[str, list[Frame]]:
    """Current Python stack of every thread, keyed by "<name> (<ident>)"; threads blocked in C show their last
    Python frame (e.g. the line calling all_reduce). Frames from files under `trim_dir` (the recorder's own
    wrapper and dump code) are left out, so the stack reads program -> torch; a thread left with nothing (it is
    only running our code) is omitted. A drill's frames stay (`distdoctor run --inject`, DRILL_FILE): a drill stops
    a rank where the program's own code would, and its stack must say the rank stands there, not inside the
    torch call that ran the drill's hook (an optimizer step's hooks run inside torch's wrapper)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = {}
    for ident, frame in sys._current_frames().items():
        if ident == skip_ident:
            continue
        frames = frames_of(frame)
        if trim_dir:
            frames = [f for f in frames if not f.filename.startswith(trim_dir) or f.filename.endswith(DRILL_FILE)]
        if frames:
            stacks[thread_key(names.get(ident, "thread"), ident)] = frames
    return stacks


def thread_key(name: str, ident: int | None) -> str:
    return f"{name} ({ident})"
