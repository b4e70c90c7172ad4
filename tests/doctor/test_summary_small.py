"""The summary of a few entries (a plain loop) states exactly what the compact form's numpy pass states."""

import dataclasses
import random

from distdoctor.trace import summary
from distdoctor.trace.model import Entry, Frame, RankTrace

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "barrier")


def _entries(rng: random.Random, n: int) -> list[Entry]:
    seqs: dict = {}
    out = []
    for i in range(n):
        group, op = rng.choice("012"), rng.choice(OPS)
        p2p = op in ("send", "recv")
        seq = None if p2p or rng.random() < 0.1 else seqs.setdefault(group, rng.randint(0, 3)) + rng.randint(0, 1)
        seqs[group] = seq if seq is not None else seqs.get(group, 0)
        size = rng.choice((4, 8, 16))
        out.append(Entry(index=i, group=group, op=op, seq=seq, p2p_seq=i if p2p else None,
                         in_sizes=[[size]], out_sizes=[[size * rng.choice((1, 2, 4))]],
                         state=rng.choice(("issued", "started", "completed", "completed")),
                         frames=[Frame("f", "/job/train.py", rng.randint(1, 3))]))
    return out


def test_small_summary_is_the_compact_summary():
    rng = random.Random(7)
    for trial in range(600):
        n = rng.choice((0, 1, 2, 3, 5, 8, 13, 40, summary.SMALL))
        if trial % 5 == 0:  # a periodic job: the steps are found from the repeating (group, op)
            period = [("0", "all_reduce"), ("1", "all_gather"), ("0", "broadcast")]
            entries = [Entry(index=i, group=g, op=op, seq=i // 3 + 1, state="completed")
                       for i, (g, op) in enumerate(period * (n // 3 + 2))][:max(n, 6)]
        else:
            entries = _entries(rng, n)
        small = summary._compute_small(entries)
        whole = _numpy(entries)
        assert _facts(small) == _facts(whole), (trial, entries)


def _facts(s) -> dict:
    """Every field, the dicts' order included (the analysis walks them in order)."""
    return {k: [(g, list(v.items()) if isinstance(v, dict) else v) for g, v in value.items()]
            if isinstance(value, dict) else value for k, value in dataclasses.asdict(s).items()}


def _numpy(entries: list[Entry]):
    """The numpy pass itself, whatever the trace's length."""
    saved = summary.SMALL
    summary.SMALL = -1
    try:
        return summary._compute(RankTrace(rank=0, source="native", entries=entries))
    finally:
        summary.SMALL = saved
