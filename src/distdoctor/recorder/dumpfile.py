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
import os
import sys
import threading
import traceback

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
        import torch

        c = torch._C._distributed_c10d
        if hasattr(c, "_dump_fr_trace"):
            return bytes(c._dump_fr_trace(True, stacks, False))
        if hasattr(c, "_dump_nccl_trace"):
            return bytes(c._dump_nccl_trace(True, stacks, False))
    except Exception as exc:
        print(f"distdoctor.recorder: warning: Flight Recorder dump failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
    return None


FR_JSON_DIR = ".fr-json"  # DISTDOCTOR_FR_JSON=1: Flight Recorder's JSON form too, hidden (one form per set)


def flight_recorder_json() -> bytes | None:
    """Flight Recorder's JSON dump (torch's `_dump_fr_trace_json`), when DISTDOCTOR_FR_JSON=1 asks for it too: the
    same trace in the form torch writes for NCCL's JSON dumps, kept apart from the pickle (FR_JSON_DIR) so a
    dump directory holds one form of each rank."""
    if os.environ.get("DISTDOCTOR_FR_JSON", "0") != "1" or not fr_enabled():
        return None
    try:
        import torch

        c = torch._C._distributed_c10d
        if hasattr(c, "_dump_fr_trace_json"):
            out = c._dump_fr_trace_json(True, False)
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


def all_thread_stacks(skip_ident: int | None = None, trim_dir: str | None = None) -> dict[str, list[Frame]]:
    """Current Python stack of every thread, keyed by "<name> (<ident>)"; threads blocked in C show their last
    Python frame (e.g. the line calling all_reduce). Frames from files under `trim_dir` (the recorder's own
    wrapper and dump code) are left out, so the stack reads program -> torch; a thread left with nothing (it is
    only running our code) is omitted."""
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = {}
    for ident, frame in sys._current_frames().items():
        if ident == skip_ident:
            continue
        frames = frames_of(frame)
        if trim_dir:
            frames = [f for f in frames if not f.filename.startswith(trim_dir)]
        if frames:
            stacks[thread_key(names.get(ident, "thread"), ident)] = frames
    return stacks


def thread_key(name: str, ident: int | None) -> str:
    return f"{name} ({ident})"
