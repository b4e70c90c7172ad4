"""The job's console, kept while it passes through: `run` reads what the launcher said of each rank's end.

torchrun's agent writes to its stderr which rank failed first, with its exit code or signal, which ranks it then
stopped, and every rank's traceback (trace/loaders/launcher_log.py reads it). A rank's dump cannot say that a
SIGSEGV or an abort ended it, or that the launcher stopped it after another went; the log can. So `run` takes
the command's stderr through a pipe, writes every byte on to its own stderr at once (the user sees the same
console), and keeps a bounded copy: the first HEAD_BYTES and the last TAIL_BYTES (the failure summary is at the
end; the first tracebacks near the start). When the job failed and the copy is a launcher's log, it is written
beside the dumps (LOG_NAME), where the closing verdict and a later `diagnose DUMP_DIR` read it.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque

from distdoctor.recorder.dumpfile import write_atomic

LOG_NAME = "launcher.log"
HEAD_BYTES = 4 << 20
TAIL_BYTES = 12 << 20
CHUNK = 1 << 16
DRAIN_S = 2.0  # after the command ended: how long to wait for what its processes still write (orphans hold the pipe)


class ConsoleTee:
    """Copies a pipe to this process's stderr, keeping the head and the tail of what went through."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_bytes = 0
        self.dropped = 0
        self.thread = threading.Thread(target=self._pump, name="distdoctor-console", daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        out = _stderr_fd()
        while True:
            try:
                chunk = os.read(self.fd, CHUNK)
            except OSError:
                break
            if not chunk:
                break
            if out is not None:
                out = _write_all(out, chunk)
            self._keep(chunk)
        try:
            os.close(self.fd)
        except OSError:
            pass

    def _keep(self, chunk: bytes) -> None:
        room = HEAD_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail.append(chunk)
        self.tail_bytes += len(chunk)
        while self.tail_bytes - len(self.tail[0]) >= TAIL_BYTES:
            self.tail_bytes -= len(old := self.tail.popleft())
            self.dropped += len(old)

    def finish(self, timeout: float = DRAIN_S) -> bytes:
        """Wait (bounded) for the pipe's end; the bytes kept, a marker where the middle was dropped."""
        self.thread.join(timeout)
        middle = f"\n[distdoctor run: {self.dropped} bytes of the console left out here]\n".encode() \
            if self.dropped else b""
        return bytes(self.head) + middle + b"".join(list(self.tail))


def save_launcher_log(kept: bytes, dump_dir: str) -> str | None:
    """Write the console beside the dumps when it is a launcher's log (torchrun's) that says how some rank ended
    (a launcher killed before its summary says nothing: a reader would refuse the file); its path, else None."""
    from distdoctor.trace.loaders.launcher_log import load_launcher_log, looks_like_launcher_log

    if not kept or not looks_like_launcher_log(kept[:1 << 16], kept[-(1 << 16):]) or not os.path.isdir(dump_dir):
        return None
    path = os.path.join(dump_dir, LOG_NAME)
    try:
        load_launcher_log(kept, path)
    except ValueError:
        return None
    try:
        write_atomic(path, kept)
    except OSError:
        return None
    return path


def _stderr_fd() -> int | None:
    try:
        sys.stderr.flush()
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (a test's capture): keep, do not echo
        return None


def _write_all(fd: int, data: bytes) -> int | None:
    """Write everything; None (stop echoing) when our stderr is gone, so that the job never blocks on it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return fd
    except OSError:
        return None
