"""Real jobs' dumps diagnosed streaming (trace/loaders/stream.py) and whole give the same report.

The real jobs' buffers are short, so the kept window is shrunk to 2 entries: nearly every collective of every
rank is then trimmed, and only what the proof allows stays."""

from __future__ import annotations

import pytest

from distdoctor.trace.loaders import load_traces, stream

from .suite import SCENARIOS, diagnose_json

pytestmark = pytest.mark.slow


def test_streamed_real_dumps_give_the_whole_sets_report(real_jobs, monkeypatch):
    monkeypatch.setattr(stream, "WINDOW", 2)
    streamed = 0
    for name in SCENARIOS:
        for mode in ("pickle", "json"):
            path = real_jobs[name]["modes"].get(mode)
            if not path:
                continue
            monkeypatch.setenv("DISTDOCTOR_STREAM", "off")
            whole = diagnose_json(path)
            monkeypatch.setenv("DISTDOCTOR_STREAM", "on")
            assert diagnose_json(path) == whole, (name, mode)
            streamed += load_traces([path], stream=True).streamed
    assert streamed >= 8  # most sets were trimmed and proven, not merely reloaded whole
