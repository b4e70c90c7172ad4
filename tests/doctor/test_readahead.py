"""The parent asks the kernel for the next dumps while workers parse earlier ones (trace/loaders/readahead.py):
within a bounded window, never blocking on an odd file, and the load the same with or without it."""

from __future__ import annotations

import json
import os
import time

import pytest

from distdoctor.trace.loaders import load_traces
from distdoctor.trace.loaders import readahead
from distdoctor.trace.loaders.readahead import Readahead


@pytest.fixture
def asked(monkeypatch):
    """The files posix_fadvise(WILLNEED) was called on, in order (the real call still runs)."""
    calls = []
    real = os.posix_fadvise

    def spy(fd, offset, length, advice):
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), advice))
        return real(fd, offset, length, advice)

    monkeypatch.setattr(readahead.os, "posix_fadvise", spy)
    return calls


def _files(tmp_path, n: int, size: int) -> list[str]:
    paths = []
    for i in range(n):
        p = tmp_path / f"rank_{i}"
        p.write_bytes(b"x" * size)
        paths.append(str(p))
    return paths


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
def test_the_window_moves_with_the_results_and_stays_bounded(tmp_path, asked):
    files = _files(tmp_path, 20, 1000)
    ahead = Readahead(files, ahead_files=5, ahead_bytes=1 << 20)
    assert [p for p, _ in asked] == files[:5] and {a for _, a in asked} == {os.POSIX_FADV_WILLNEED}
    ahead.advance(3)
    assert [p for p, _ in asked] == files[:8]
    ahead.advance(3)  # nothing new taken: nothing new asked
    assert len(asked) == 8
    ahead.advance(20)
    assert [p for p, _ in asked] == files  # each file once, in order


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
def test_the_byte_bound_holds_but_the_next_file_is_always_asked_for(tmp_path, asked):
    files = _files(tmp_path, 6, 4000)
    ahead = Readahead(files, ahead_files=64, ahead_bytes=10_000)
    assert len(asked) == 3  # 3 x 4000 >= 10 000: the window is full
    ahead.advance(3)
    assert len(asked) == 6
    (tmp_path / "big").mkdir()
    big = _files(tmp_path / "big", 2, 50_000)
    asked.clear()
    Readahead(big, ahead_files=64, ahead_bytes=10_000)
    assert len(asked) == 1  # a file larger than the window is still asked for when it is next


def _until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this platform")
def test_in_the_background_the_window_holds_and_close_ends_the_thread(tmp_path, asked):
    """As the loader asks (from a thread of its own, so that a call the kernel makes wait does not hold the
    results up): the same files in the same order within the same window; close() ends the thread, also one
    waiting for room."""
    files = _files(tmp_path, 20, 1000)
    ahead = Readahead(files, ahead_files=5, ahead_bytes=1 << 20, background=True)
    assert _until(lambda: len(asked) == 5)
    time.sleep(0.2)
    assert [p for p, _ in asked] == files[:5]  # the window is full: the thread waits
    ahead.advance(20)
    assert _until(lambda: len(asked) == 20) and [p for p, _ in asked] == files
    ahead.close()
    assert not ahead._thread.is_alive()
    waiting = Readahead(files, ahead_files=2, ahead_bytes=1 << 20, background=True)
    assert _until(lambda: waiting.asked == 2)
    waiting.close()
    assert not waiting._thread.is_alive() and waiting.asked == 2


def test_odd_files_are_passed_over_without_blocking(tmp_path):
    """A FIFO with no writer (opened plainly, it would block forever), a missing file, a directory."""
    fifo = tmp_path / "rank_0"
    os.mkfifo(fifo)
    (tmp_path / "dir").mkdir()
    ahead = Readahead([str(fifo), str(tmp_path / "gone"), str(tmp_path / "dir")])
    assert ahead.asked == 3


def test_a_set_loads_the_same_without_the_call(tmp_path, monkeypatch):
    """Where posix_fadvise is missing (not Linux) the load is as before."""
    for r in range(64):
        entries = [{"record_id": i, "process_group": ["0", "default_pg"], "collective_seq_id": i + 1,
                    "profiling_name": "gloo:all_reduce", "state": "completed", "input_sizes": [[4]],
                    "output_sizes": [[4]], "input_dtypes": ["Float"], "output_dtypes": ["Float"]}
                   for i in range(3)]
        (tmp_path / f"rank_{r}.json").write_text(json.dumps({"version": "2.10", "entries": entries}))
    with_call = load_traces([str(tmp_path)], jobs=2)
    monkeypatch.delattr(readahead.os, "posix_fadvise")
    without = load_traces([str(tmp_path)], jobs=2)
    assert sorted(with_call.ranks) == sorted(without.ranks) == list(range(64))
    assert [len(t.entries) for t in with_call.ranks.values()] == [len(t.entries) for t in without.ranks.values()]
