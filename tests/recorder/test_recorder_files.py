"""Dump files: atomic (a writer killed mid-write never leaves a torn file), owner-only, configuration checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from distdoctor.recorder import dumpfile
from distdoctor.trace.model import loads
from distdoctor.recorder import RecorderConfig

from recorder_helpers import kill_group


def test_write_atomic_is_private_and_hidden_while_writing(tmp_path):
    d = tmp_path / "new" / "dumps"
    dumpfile.ensure_private_dir(str(d))
    assert os.stat(d).st_mode & 0o777 == 0o700
    target = d / "rank_0.jsonl"
    tmp = dumpfile.temp_name(str(target))
    assert os.path.dirname(tmp) == str(d) and os.path.basename(tmp).startswith(".rank_0.jsonl.tmp-")
    dumpfile.write_atomic(str(target), b"first\n")
    assert target.read_bytes() == b"first\n" and os.stat(target).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in d.iterdir()) == ["rank_0.jsonl"]


def test_failed_write_keeps_previous_dump_and_no_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "rank_0.jsonl"
    dumpfile.write_atomic(str(target), b"complete old dump\n")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dumpfile.os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        dumpfile.write_atomic(str(target), b"new dump that never lands\n")
    assert target.read_bytes() == b"complete old dump\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rank_0.jsonl"]


def test_writer_killed_mid_write_never_leaves_a_torn_file(tmp_path):
    """A process rewrites a ~1 MB dump in a loop and is SIGKILLed at several points: every time, the file on
    disk is a complete dump (or absent before the first write), never a prefix."""
    target = tmp_path / "rank_0.jsonl"
    script = textwrap.dedent(f"""
        import sys
        from distdoctor.recorder.dumpfile import write_atomic
        from distdoctor.trace.model import Entry, RankTrace, dumps
        entries = [Entry(index=i, group="0", op="all_reduce", seq=i + 1) for i in range(10000)]
        i = 0
        while True:
            i += 1
            t = RankTrace(rank=0, source="native", world_size=2, dump_reason=f"write {{i}}", entries=entries)
            write_atomic({str(target)!r}, dumps(t).encode())
            print(i, flush=True)
    """)
    for delay in (0.2, 0.5):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            proc.stdout.readline()  # at least one complete write happened
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            kill_group(proc)
        trace = loads(target.read_text())
        assert len(trace.entries) == 10000 and trace.entries[-1].seq == 10000
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != "rank_0.jsonl"]
        assert all(n.startswith(".rank_0.jsonl.tmp-") for n in leftovers), leftovers  # hidden, never rank_*
        for n in leftovers:
            (tmp_path / n).unlink()


def test_config_from_environment(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DISTDOCTOR_DUMP_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("DISTDOCTOR_HANG_TIMEOUT", "12.5")
    monkeypatch.setenv("DISTDOCTOR_BUFFER", "64")
    cfg = RecorderConfig.resolve()
    assert (cfg.dump_dir, cfg.hang_timeout, cfg.buffer_size) == (str(tmp_path / "d"), 12.5, 64)
    assert RecorderConfig.resolve(hang_timeout=0).hang_timeout is None  # 0 switches the watchdog off
    monkeypatch.setenv("DISTDOCTOR_BUFFER", "lots")
    assert RecorderConfig.resolve().buffer_size == 2000
    assert "DISTDOCTOR_BUFFER='lots' is not a non-negative number" in capsys.readouterr().err
    with pytest.raises(ValueError):
        RecorderConfig.resolve(buffer_size=0)
