"""A cycle of waits all at one number of one group is no order deadlock: its ranks are in different calls there.

Two members that wait for each other in collective #n of the same group did not issue their calls in different
orders - each is in the group's n-th call. They issued different calls at n: one skipped a call, or issued
another. The recorder's watchdog can show a rank blocked in a call its trace does not hold (hang_status.py,
issued from C++ or by a functional collective), so the calls themselves may never meet in match.py, only the
waits. It is a `type_mismatch`, and who differs is weighed as any tie is: the sibling groups (same size and
description, disjoint, the same program) say what the group's n-th call is; the ranks whose call differs from
their unanimous one are named, else every rank of the cycle, "one of".
"""

from __future__ import annotations

from collections import Counter

from distdoctor.diagnose.ties import sibling_votes
from distdoctor.diagnose.waitfor import Cycle
from distdoctor.findings.kinds import Finding, fmt_group, fmt_ranks


def same_number(c: Cycle, views: dict) -> Finding | None:
    """The type_mismatch a cycle within one collective number of one group is, else None."""
    calls = {a: w.entry for a, _, w in c.steps}
    places = {(e.group, e.seq) for e in calls.values()}
    if len(places) != 1 or any(e.is_p2p or e.seq is None for e in calls.values()):
        return None
    group, seq = next(iter(places))
    ops = {a: e.op for a, e in calls.items()}
    if len(set(ops.values())) < 2 or group not in views:
        return None
    view = views[group]
    votes: Counter = sibling_votes(view, views, seq, "op")
    usual = next(iter(votes)) if len(votes) == 1 else None
    odd = sorted(a for a, op in ops.items() if op != usual) if usual in ops.values() else []
    ranks = odd or sorted(ops)
    said = "; ".join(f"rank {a} is in {op} #{seq}" for a, op in sorted(ops.items()))
    if odd:
        why = (f"the sibling groups' members all issued {usual} #{seq}: {fmt_ranks(odd)} issued another call "
               "(skipped one, or made one more)")
    else:
        why = (f"one of {fmt_ranks(ranks)}: nothing says which issued the other call (no sibling group agrees on "
               f"#{seq})")
    detail = (f"{fmt_ranks(sorted(ops))} wait for each other in collective #{seq} of {fmt_group(group, view.desc)}, "
              f"each in another call: {said}. No order of calls explains that; {why}.")
    first = calls[ranks[0]]
    return Finding("type_mismatch", ranks, group=group, seq=seq, op=first.op, t=first.t_created, detail=detail,
                   evidence={"ops": {str(a): op for a, op in sorted(ops.items())}, "siblings": dict(votes),
                             "cycle": [{"rank": a, "waits_for": b} for a, b, _ in c.steps]})
