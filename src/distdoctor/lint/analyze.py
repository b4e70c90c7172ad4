"""Run every hazard check over one set of traces; the report `distdoctor lint` prints."""

from __future__ import annotations

from dataclasses import dataclass, field

from distdoctor.lint import conditional, creation, order, p2p, streams
from distdoctor.lint.hazard import Hazard
from distdoctor.trace.model import TraceSet

CHECKS = (("order_inversion", order.find), ("rank_conditional_collective", conditional.find),
          ("p2p_order", p2p.find), ("group_creation_order", creation.find), ("false_wait", streams.find))


@dataclass
class LintReport:
    traces: TraceSet
    hazards: list[Hazard] = field(default_factory=list)
    evidence: dict[str, str] = field(default_factory=dict)  # check -> what the traces let it see

    @property
    def verdict(self) -> str:
        return "hazards" if self.hazards else "clean"

    def to_json(self) -> dict:
        ts = self.traces
        return {"verdict": self.verdict, "hazards": [h.to_json() for h in self.hazards],
                "world_size": ts.world_size, "ranks_loaded": sorted(ts.ranks), "checks": self.evidence,
                "load_errors": [{"path": e.path, "reason": e.reason} for e in ts.errors]}


def coverage(ts: TraceSet) -> dict[str, str]:
    """Per check, which ranks' traces carry its evidence: 'clean' means nothing, where nothing could be seen."""
    n = len(ts.ranks)
    framed = sum(1 for t in ts.ranks.values() if any(t.column("frames")))
    recorder = sum(1 for t in ts.ranks.values() if t.source.startswith("native"))
    created = sum(1 for t in ts.ranks.values() if t.group_creations)
    streamed = sum(1 for t in ts.ranks.values() if streams.device_streams(t))
    return {"order_inversion": f"{n} of {n} ranks",
            "rank_conditional_collective": f"{framed} of {n} ranks have call sites",
            "p2p_order": f"{recorder} of {n} ranks have the recorder's send/recv",
            "group_creation_order": f"{created} of {n} ranks recorded their group creations",
            "false_wait": f"{streamed} of {n} ranks carry device streams"}


def lint(ts: TraceSet) -> LintReport:
    report = LintReport(ts, evidence=coverage(ts))
    for _, check in CHECKS:
        report.hazards.extend(check(ts))
    return report
