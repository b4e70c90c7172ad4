"""Chrome/Perfetto trace JSON (the "Trace Event Format"), shared by `diagnose` and `sim` timelines.

A timeline is a list of `Span`s: one process per rank, one thread per stream (or process group); blocked
spans are drawn in a warning colour and carry `blocked: true` in their args, so a real and a simulated hang
look the same in Perfetto.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Span:
    rank: int
    track: str  # stream, thread or group name
    name: str
    start_us: float
    dur_us: float
    blocked: bool = False
    args: dict = field(default_factory=dict)


def to_chrome_trace(spans: list[Span], title: str = "distdoctor") -> dict:
    tids: dict[tuple[int, str], int] = {}
    events: list[dict] = []
    for span in spans:
        key = (span.rank, span.track)
        if key not in tids:
            tids[key] = len(tids) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": span.rank, "tid": tids[key],
                           "args": {"name": span.track}})
    for rank in sorted({s.rank for s in spans}):
        events.append({"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}})
    for span in spans:
        event = {"ph": "X", "name": span.name, "pid": span.rank, "tid": tids[(span.rank, span.track)],
                 "ts": span.start_us, "dur": max(span.dur_us, 0.0), "args": dict(span.args)}
        if span.blocked:
            event["cname"] = "terrible"
            event["args"]["blocked"] = True
        events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"title": title}}


def write_chrome_trace(spans: list[Span], path: str | Path, title: str = "distdoctor") -> None:
    Path(path).write_text(json.dumps(to_chrome_trace(spans, title)))
