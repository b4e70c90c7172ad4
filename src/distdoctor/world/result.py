"""What run_job brings back: every rank's result and records, and the ranks that were lost, with why."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class LostRank:
    rank: int
    host: str
    reason: str  # "exited with code -9" / "hung: no progress for 63 s" / "unreachable"
    in_op: str | None  # what the rank was doing (its last ctx.phase)

    def describe(self) -> str:
        where = f" in {self.in_op}" if self.in_op else ""
        return f"rank {self.rank} on {self.host} {self.reason}{where}"


@dataclass
class JobResult:
    world_size: int
    backend: str
    device: str  # "cpu" | "cuda"
    results: dict[int, Any] = field(default_factory=dict)
    records: dict[int, list] = field(default_factory=dict)
    lost: list[LostRank] = field(default_factory=list)
    ok: bool = True
    is_reporter: bool = True
    iface: str | None = None
    errors: dict[int, str] = field(default_factory=dict)  # ranks whose function raised (victims included)
    phases: dict[int, str | None] = field(default_factory=dict)  # each rank's last phase
    mode: str = "standalone"  # "standalone" | "launcher"
    wall_s: float = 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["results"] = {str(k): v for k, v in self.results.items()}
        d["records"] = {str(k): v for k, v in self.records.items()}
        d["errors"] = {str(k): v for k, v in self.errors.items()}
        d["phases"] = {str(k): v for k, v in self.phases.items()}
        return d

