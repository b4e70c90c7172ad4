"""Health events: one record per problem, to a JSON-lines file and to the `logging` module.

An event is keyed by (kind, ranks, subject); the same key is emitted once, so a NaN that persists for a
thousand steps, or a straggler that stays slow, gives one line, not a thousand. A problem that clears and
comes back (`rearm(kind)`) is emitted again. Only the reporting rank writes the file: events are built from
data already gathered across ranks, so every rank would otherwise write the same line.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("distdoctor.health")

KINDS = ("replica_divergence", "nonfinite", "loss_flat", "loss_rising", "straggler", "memory_imbalance")


@dataclass
class HealthEvent:
    kind: str  # one of KINDS
    step: int  # the training step (0-based) where the problem was first seen
    ranks: list[int]  # global ranks at fault
    detail: str  # one plain sentence with the numbers
    subject: str = ""  # parameter or module name, when there is one
    data: dict[str, Any] = field(default_factory=dict)  # the evidence, machine-readable
    time: float = field(default_factory=time.time)

    def key(self) -> tuple:
        return (self.kind, tuple(self.ranks), self.subject)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class EventSink:
    """Deduplicates events and writes each new one to `path` (JSON lines, appended) and the log."""

    def __init__(self, path: str | os.PathLike | None = None, write: bool = True):
        self.path = os.fspath(path) if path is not None else None
        self.write = write
        self.events: list[HealthEvent] = []
        self._seen: set[tuple] = set()
        if self.path and self.write:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)

    def emit(self, event: HealthEvent) -> bool:
        """Record `event` unless the same problem was already reported. Returns True when it was new."""
        if event.key() in self._seen:
            return False
        self._seen.add(event.key())
        self.events.append(event)
        if self.write:
            log.warning("%s at step %d on rank(s) %s: %s", event.kind, event.step, event.ranks, event.detail)
            if self.path:
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(event.to_json(), sort_keys=True) + "\n")
        return True

    def rearm(self, kind: str) -> None:
        """The problem of this kind has cleared: the next occurrence is reported again."""
        self._seen = {k for k in self._seen if k[0] != kind}

    def seen(self, kind: str) -> bool:
        return any(k[0] == kind for k in self._seen)


def read_events(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Events from a JSON-lines file written by EventSink (for tests and tools)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
