"""What each member did after the call before: a rank alone in a call that no other member of its group, nor of
the group's siblings, made next.

A rank of a device mesh that issues one call more on its group (a reduce_scatter of FSDP's issued twice) waits in
it alone; its group's other members made their next call elsewhere (the replicate group's all_reduce, the loss's)
and wait there, some of them for it. Read call by call, the group's other member never issued #n: the verdict
named it (`missing_ranks`), a false claim, in every form of dump (fuzz runs 74-124, 74-172: HSDP, `twice`).
The sibling groups (the same dimension of the mesh for the other replicas: same description and size, disjoint)
run the same program. So every member of the group and of its siblings but the lone caller is a voter: the call
it made right after its call #n - 1 on its group. Where at least two voters made that next call on another group,
of a dimension the lone caller has a group of too (a subgroup's call it is no member of is none it owed), none on
their own, and none made a call #n on its group at all, the lone caller's #n is what no other member made
there: it issued one call more, or skipped the call the others made next (`type_mismatch`, the form parted.py
gives a call that parts from the others').
"""

from __future__ import annotations

from distdoctor.diagnose.ties import sibling_groups
from distdoctor.findings.kinds import Finding, fmt_group, fmt_ranks
from distdoctor.trace.model import Entry, TraceSet

LOOK_BACK = 4096  # entries from a rank's end searched for its call #n - 1 (a hang holds it among its last)
MIN_VOTERS = 2


def lone_next_call(ts: TraceSet, views: dict, group: str, seq: int, caller: int) -> Finding | None:
    """The finding naming `caller`, alone in collective `seq` of `group`, when the voters (see above) made their
    next call after #seq - 1 on another group; else None."""
    view = views.get(group)
    if view is None or seq < 2 or not view.desc:
        return None
    family = [view] + sibling_groups(view, views)
    votes: dict[str, list[int]] = {"elsewhere": [], "here": [], "unknown": []}
    dims = {o.desc for o in views.values() if caller in o.members and o.desc}  # where it has calls to make too
    for g in family:
        for r in g.members:
            if r != caller:
                votes[_vote(ts, views, g, r, seq, dims)].append(r)
    if len(votes["elsewhere"]) < MIN_VOTERS or votes["here"] or votes["unknown"]:
        return None
    e = view.by_rank[caller][seq]
    voters = sorted(votes["elsewhere"])
    detail = (f"rank {caller} issued {e.op} #{seq} on {fmt_group(group, view.desc)} right after its #{seq - 1}; "
              f"every other member of that group and of its sibling groups ({fmt_ranks(voters)}) made its next "
              f"call after #{seq - 1} on another group, and none a #{seq} on its own: rank {caller} issued one call "
              f"more there, or skipped the call the others made next (diagnose/next_call.py).")
    return Finding("type_mismatch", [caller], group=group, seq=seq, op=e.op, t=e.t_created, detail=detail,
                   evidence={"parted": "next_call", "voters": voters, "groups": sorted(g.name for g in family)})


def _vote(ts: TraceSet, views: dict, view, rank: int, seq: int, dims: set[str]) -> str:
    """'elsewhere' where the rank's call right after its #seq - 1 on the group is on another group, of a dimension
    the lone caller has a group of too (`dims`: a call of a subgroup it is no member of is none it owed), the
    rank holds no #seq there and it stands in a call (it went on and waits); 'here' where it made #seq;
    'unknown' where its trace shows neither (no trace, #seq - 1 not reached, nothing after it yet, a call
    elsewhere that says nothing of the caller, or no call it stands in: a rank behind the caller, or stopped on
    its way, may yet make #seq - fuzz run 71-205, tensor parallel, where two such read as voters against a rank
    merely further along; Gloo's Flight Recorder retires a failed call as completed, which reads so too)."""
    calls = view.by_rank.get(rank) or {}
    if seq in calls:
        return "here"
    before = calls.get(seq - 1)
    if before is None or max(calls, default=0) != seq - 1:
        return "unknown"
    entries = ts.ranks[rank].entries
    if not len(entries) or entries[-1].state == "completed":
        return "unknown"  # in no call: behind (or stopped on the way), it may yet make #seq
    after = _next_entry(entries, before)
    there = views.get(after.group) if after is not None and not after.is_p2p else None
    return "elsewhere" if there is not None and there is not view and there.desc in dims else "unknown"


def _next_entry(entries, e: Entry) -> Entry | None:
    """The entry right after `e` in the rank's own order (its trace's), among its last LOOK_BACK."""
    n = len(entries)
    for i in range(n - 1, max(n - 1 - LOOK_BACK, -1), -1):
        if entries[i] is e or (entries[i].group == e.group and entries[i].seq == e.seq and not entries[i].is_p2p):
            return entries[i + 1] if i + 1 < n else None
    return None
