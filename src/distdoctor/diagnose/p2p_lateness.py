"""Stragglers among sends and receives: no hang, but a rank posts its half of each p2p pair late, consistently
(a pipeline stage slower than the others).

Samples. Sends and receives pair FIFO per (group, sender, receiver) (p2p.py); each pair both of whose halves
carry an arrival time (`t_created`) is a two-member row for the one straggler rule (world/lateness.py), judged
per sender and receiver (each way a class, as the collective rule's classes): a rank's lateness there is its
arrival minus its peer's. A healthy stage sends after its compute (late, by that compute) and receives before
its peer sends (early). A stage slow by its own work posts every half late, its receives too; it is named where
the rule finds it late (by more than MIN_LATE_S and the noise, over at least MIN_PAIRS pairs) in every way it was
judged in, receiving in one of them at least. Its neighbours, early against it, are not; a first stage that
only sends is never judged by its sends alone.

Collectives are judged by straggler.py; a rank found there is not named again here.
"""

from __future__ import annotations

from distdoctor.diagnose.waitfor import p2p_index
from distdoctor.findings.kinds import Finding
from distdoctor.trace.model import TraceSet
from distdoctor.world.lateness import late_ranks

MIN_PAIRS = 6  # pairs with one peer, for the rule to judge a rank against it


def _pairs(ts: TraceSet) -> dict[tuple[int, int], list[dict[int, float]]]:
    """Per sender and receiver, one {sender: arrival, receiver: arrival} per matched pair with both times."""
    idx = p2p_index(ts)
    out: dict[tuple[int, int], list[dict[int, float]]] = {}
    for (group, src, dst, kind), sends in idx.items():
        if kind != "send":
            continue
        for s, r in zip(sends, idx.get((group, src, dst, "recv"), [])):
            if s.t_created is not None and r.t_created is not None:
                out.setdefault((src, dst), []).append({src: s.t_created, dst: r.t_created})
    return out


def _judged(pairs: dict[tuple[int, int], list[dict[int, float]]]) -> dict[int, list[tuple]]:
    """rank -> (sender, receiver, its median lateness, noise, pairs) for each way it was judged late in, for the
    ranks late in every way they were judged in (at least MIN_PAIRS pairs), receiving in one of them at least."""
    late: dict[int, list | None] = {}
    for (src, dst), rows in pairs.items():
        if len(rows) < MIN_PAIRS:
            continue
        judged = late_ranks(rows)
        for r in (src, dst):
            if r in judged.late and late.get(r, []) is not None:
                late.setdefault(r, []).append((src, dst, judged.late[r], judged.noise_s, len(rows)))
            else:
                late[r] = None
    return {r: got for r, got in late.items() if got and any(dst == r for _, dst, *_ in got)}


def find_p2p_stragglers(ts: TraceSet, named: set[int] = frozenset()) -> list[Finding]:
    """A rank late in every way it exchanges messages, its receives too: a stage slow by its own work, not one
    that sends after its compute (late) and receives before its peer sends (early), as every healthy stage."""
    out = []
    for r, got in sorted(_judged(_pairs(ts)).items()):
        if r in named:
            continue
        late_ms = max(late for *_, late, _, _ in got) * 1e3
        each = "; ".join(f"{'sending to' if src == r else 'receiving from'} rank {dst if src == r else src} by "
                         f"{late * 1e3:.0f} ms ({n} pairs, noise ±{noise * 1e3:.1f} ms)"
                         for src, dst, late, noise, n in got)
        out.append(Finding(
            "straggler", [r],
            detail=(f"rank {r} posts its half of each send/recv pair late, a median: {each}. It posts its receives "
                    f"late too, where a stage that only waits for another posts them early: it is slow by its own "
                    f"work."),
            evidence={"late_ms": round(late_ms, 2), "p2p": True,
                      "ways": [{"src": src, "dst": dst, "late_ms": round(late * 1e3, 2), "pairs": n,
                                "noise_ms": round(noise * 1e3, 3)} for src, dst, late, noise, n in got]}))
    return out
