"""Ask the kernel to read the next dumps of a set while the workers parse the earlier ones.

A worker reads a dump, then parses it: while it reads, its core waits on the disk, and while it parses, the disk
is idle. When the dumps are not in the page cache (a set just copied off the cluster, or one larger than the
machine's memory), that costs a third of the time at 16 384 ranks. posix_fadvise(WILLNEED) starts the kernel's
read of a file without waiting for it, so the parent keeps a bounded window of files ahead of the results being
read, and the workers then find them in memory. The kernel may make the call wait while it queues the reads
(a disk still busy with the earlier files): the loader asks from a thread of its own (`background`), so the
results keep being taken meanwhile and no worker waits to hand its result over.

Only advice: where the call is missing (not Linux) or fails, nothing happens and the load is as before.
"""

from __future__ import annotations

import os
import threading

AHEAD_FILES = 64  # beyond the files the workers hold (jobs x chunk), so the kernel has time to read them
AHEAD_BYTES = 256 << 20  # the window's bound in memory: page cache, not the process, but still the machine's


class Readahead:
    """Keeps up to AHEAD_FILES files and AHEAD_BYTES bytes asked for ahead of the last result taken: in the
    caller's thread, or with `background` in a thread of its own until close()."""

    def __init__(self, files: list[str], ahead_files: int = AHEAD_FILES, ahead_bytes: int = AHEAD_BYTES,
                 background: bool = False) -> None:
        self.files = files
        self.ahead_files = ahead_files
        self.ahead_bytes = ahead_bytes
        self.asked = 0  # files[:asked] have been asked for
        self.sizes: list[int] = []  # bytes asked for, per file asked
        self.enabled = hasattr(os, "posix_fadvise")
        self.taken = 0
        self._wake = threading.Condition()
        self._closed = False
        self._thread = None
        if self.enabled and background:
            self._thread = threading.Thread(target=self._run, name="distdoctor-readahead", daemon=True)
            self._thread.start()
        else:
            self.advance(0)

    def advance(self, taken: int) -> None:
        """`taken` results have come back: ask for the next files, within the window."""
        if not self.enabled:
            return
        if self._thread is None:
            while self._room(taken):
                self._ask_next()
            return
        with self._wake:
            self.taken = taken
            self._wake.notify()

    def close(self, timeout: float = 1.0) -> None:
        """Stop asking; the thread ends after the call it is in (bounded: a daemon thread, waited for
        `timeout` seconds at most)."""
        if self._thread is None:
            return
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout)

    def _run(self) -> None:
        while self.asked < len(self.files):
            with self._wake:
                while not self._closed and not self._room(self.taken):
                    self._wake.wait(1.0)
                if self._closed:
                    return
            self._ask_next()  # (outside the lock: the call may wait on the disk)

    def _room(self, taken: int) -> bool:
        pending = sum(self.sizes[taken:self.asked])
        return (self.asked < len(self.files) and self.asked < taken + self.ahead_files
                and (pending < self.ahead_bytes or self.asked == taken))

    def _ask_next(self) -> None:
        self.sizes.append(_advise(self.files[self.asked]))
        self.asked += 1


def _advise(path: str) -> int:
    """Ask for `path`'s pages; its size in bytes (0 where it cannot be opened: the worker words that)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return 0
    try:
        size = os.fstat(fd).st_size
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        return size
    except OSError:
        return 0
    finally:
        os.close(fd)
