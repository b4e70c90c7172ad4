"""Where a rank's calls part from its peers' in the code: the first collective it issued from a different call
site than most of the others did at the same sequence number. That is how an asymmetric code path shows before a
hang: the numbers still agree, but a rank's n-th collective comes from another line (it skipped one, or issued
an extra one)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distdoctor.trace.code_origin import is_user_code
from distdoctor.trace.model import Entry

if TYPE_CHECKING:
    from distdoctor.diagnose.match import GroupView


def callsite(e: Entry) -> tuple:
    """The chain of user (non-torch) frames that issued an entry, innermost first; empty without frames."""
    return tuple((f.filename, f.line, f.name) for f in reversed(e.frames)
                 if is_user_code(f.filename))


def fmt_site(site: tuple) -> str:
    """A callsite() chain as 'step (train.py:12) <- main (train.py:40)', three frames at most."""
    return " <- ".join(f"{n} ({fn.rsplit('/', 1)[-1]}:{ln})" for fn, ln, n in site[:3])


def callsite_divergence(view: GroupView, rank: int, upto: int) -> dict | None:
    """First seq (< upto) where `rank` issued from a different code path than the majority of the others.

    This is how an asymmetric code path shows up before the hang: the seq numbers still agree, but one rank's
    n-th collective comes from another line (it skipped one, or issued an extra one)."""
    mine = view.by_rank.get(rank, {})
    others = [r for r in view.by_rank if r != rank and view.by_rank[r]]
    for seq in sorted(s for s in mine if s < upto):
        site = callsite(mine[seq])
        if not site:
            return None
        theirs: dict[tuple, list[int]] = {}
        for r in others:
            e = view.by_rank[r].get(seq)
            if e is not None:
                theirs.setdefault(callsite(e), []).append(r)
        if not theirs:
            continue
        majority = max(theirs, key=lambda k: len(theirs[k]))
        if majority and majority != site:
            return {"seq": seq, "op": mine[seq].op, "rank_site": fmt_site(site), "others_site": fmt_site(majority),
                    "others": theirs[majority]}
    return None

