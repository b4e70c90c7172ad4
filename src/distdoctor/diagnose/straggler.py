"""Stragglers: no hang, but a rank arrives late at collectives, consistently.

For every collective that all members issued (matched by group and seq), each member's lateness is its
`t_created` minus the earliest member's. A rank is a straggler when, over at least MIN_SAMPLES collectives, it is
the last to arrive in at least LAST_SHARE of them and its median lateness is at least MIN_LATE_S and at least
RATIO times the median lateness of the other ranks. Assumption: clocks of the ranks agree to well under
MIN_LATE_S (one host, or NTP-synced hosts); a constant clock offset between hosts would read as lateness.
"""

from __future__ import annotations

from statistics import median

from distdoctor.diagnose.findings import Finding
from distdoctor.diagnose.match import GroupView, SeqEntries

MIN_SAMPLES = 4
LAST_SHARE = 0.6
MIN_LATE_S = 0.02
RATIO = 3.0


def _field(seqs, name: str) -> dict:
    return seqs.field(name) if isinstance(seqs, SeqEntries) else {s: getattr(e, name) for s, e in seqs.items()}


def find_stragglers(views: dict[str, GroupView]) -> list[Finding]:
    late: dict[int, list[float]] = {}
    last_count: dict[int, int] = {}
    samples = 0
    example: dict[int, tuple[str, int, str]] = {}
    for view in views.values():
        ranks = [r for r, seqs in view.by_rank.items() if seqs]
        if len(ranks) < 2 or len(ranks) < len(view.members):
            continue
        common = set.intersection(*(set(view.by_rank[r]) for r in ranks))
        created = {r: _field(view.by_rank[r], "t_created") for r in ranks}  # without building entries
        for seq in common:
            times = {r: created[r][seq] for r in ranks}
            if any(t is None for t in times.values()):
                continue
            first = min(times.values())
            samples += 1
            last = max(times, key=times.get)
            last_count[last] = last_count.get(last, 0) + 1
            if last not in example:
                example[last] = (view.name, seq, view.by_rank[last][seq].op)
            for r, t in times.items():
                late.setdefault(r, []).append(t - first)
    if samples < MIN_SAMPLES:
        return []
    out = []
    medians = {r: median(v) for r, v in late.items()}
    for r, count in sorted(last_count.items()):
        others = [m for q, m in medians.items() if q != r]
        ref = median(others) if others else 0.0
        if (count >= LAST_SHARE * samples and medians[r] >= MIN_LATE_S and medians[r] >= RATIO * max(ref, 1e-9)):
            group, seq, op = example[r]
            out.append(Finding(
                "straggler", [r], group=group, seq=seq, op=op,
                detail=f"rank {r} arrived last at {count} of {samples} collectives, a median {medians[r] * 1e3:.0f} ms "
                       f"after the first rank (other ranks: median {ref * 1e3:.1f} ms).",
                evidence={"last_arrivals": count, "collectives": samples,
                          "median_late_ms": {str(q): round(m * 1e3, 2) for q, m in sorted(medians.items())}}))
    return out
