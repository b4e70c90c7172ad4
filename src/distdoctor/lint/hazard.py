"""One latent hazard: what `distdoctor lint` reports, and its one adapter to diagnose's Finding (for the text
renderer diagnose uses).

JSON contract (`distdoctor lint --format json`): `{"verdict": "clean"|"hazards", "hazards": [{"kind", "ranks",
"groups", "sites", "detail", ...}]}`; `sites` is a list of {"ranks", "what", "site"} (the user's file:line chain,
as diagnose's findings give them in evidence.sites). Fields may be added, never renamed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from distdoctor.findings.kinds import HAZARD_KINDS as KINDS
from distdoctor.findings.kinds import Finding, fmt_ranks
from distdoctor.diagnose.sites import fmt_chain, user_chain
from distdoctor.trace.model import Entry, Frame

MAX_SITES = 8  # sites named per hazard (a thousand-rank hazard has a handful of distinct ones)


@dataclass
class Hazard:
    kind: str
    ranks: list[int]
    groups: list[str]
    detail: str
    sites: list[dict] = field(default_factory=list)  # [{"ranks", "what", "site"}]
    evidence: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown hazard kind {self.kind!r}")
        self.ranks = sorted(set(self.ranks))

    def add_site(self, ranks, what: str, site: str | None) -> None:
        """Name where `ranks` did `what` (merged with an earlier identical one); nothing without a site."""
        if not site:
            return
        for s in self.sites:
            if s["what"] == what and s["site"] == site:
                s["ranks"] = sorted(set(s["ranks"]) | set(ranks))
                return
        if len(self.sites) < MAX_SITES:
            self.sites.append({"ranks": sorted(set(ranks)), "what": what, "site": site})

    def sentence(self) -> str:
        """The detail, then the call sites in one sentence (as diagnose's annotate writes them)."""
        if not self.sites:
            return self.detail
        words = "; ".join(f"{fmt_ranks(s['ranks'])} {s['what']} {s['site']}" for s in self.sites)
        return f"{self.detail} In the code: {words}."

    def to_json(self) -> dict:
        return {"kind": self.kind, "ranks": self.ranks, "groups": self.groups, "sites": self.sites,
                "detail": self.sentence(), "evidence": self.evidence}


def to_finding(h: Hazard) -> Finding:
    """The one coupling to diagnose's findings: a hazard as a Finding, for the shared text renderer."""
    return Finding(h.kind, h.ranks, groups=list(h.groups), detail=h.sentence(),
                   evidence={**h.evidence, "sites": h.sites})


def user_frames(e: Entry) -> list[Frame]:
    """The user's frames of an entry, innermost first, at most three (diagnose's rule: not torch's, not the
    recorder's wrappers)."""
    return user_chain(e.frames)


def site_of(e: Entry | None) -> str | None:
    """The user's call chain of an entry ('fn (/abs/file.py:12) <- caller (train.py:40)'), None without frames."""
    chain = user_frames(e) if e is not None else []
    return fmt_chain(chain) if chain else None


def call(e: Entry) -> str:
    seq = e.p2p_seq if e.is_p2p else e.seq
    return f"{e.op} #{seq}" if seq is not None else e.op
