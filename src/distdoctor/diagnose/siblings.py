"""A group whose other members left no trace, judged by its sibling groups (`unmet_by_siblings`): Gloo aborts a
process (SIGABRT, no dump) whose peer passes another dtype or size, so the call that changed has no member left to
be compared with but the members of the groups that run the same program beside it."""

from __future__ import annotations

from distdoctor.collectives.names import same_collective
from distdoctor.diagnose.match import Divergence, GroupView, divergences
from distdoctor.diagnose.ties import sibling_groups, value_of
from distdoctor.trace.model import TraceSet


def all_divergences(ts: TraceSet, views: dict[str, GroupView]) -> list[Divergence]:
    """match.py's divergences, and for each group with none, what its sibling groups say of it."""
    out = divergences(ts, views)
    diverged = {d.group for d in out}
    traced = set(ts.ranks)
    untraced = [r for r in range(ts.world_size or 0) if r not in traced]
    for name in sorted(views):
        if name not in diverged:
            d = unmet_by_siblings(views[name], views, traced, untraced)
            if d is not None:
                out.append(d)
    return out


HISTORY = 64  # earlier calls of a group its siblings' calls must match before they vouch for the next one


def unmet_by_siblings(view: GroupView, views: dict[str, GroupView], traced: set[int],
                      untraced: list[int]) -> Divergence | None:
    """A group whose other members left no trace (Gloo aborts a process, SIGABRT and no dump, when its peer passes
    another dtype or size): the members that are left cannot be compared with them, but with the sibling groups
    (ties.py: same size and description, disjoint, the same program). Where a left member's last call on the
    group (the one its peers died in; Gloo's Flight Recorder retires a call that failed) passes another dtype or
    size than the siblings' members all passed at that position, while its earlier calls there matched theirs,
    it changed its call: the mismatch is the cause, the members without a trace its victims (no finding where
    the earlier calls differ: pipeline stages' groups legitimately do). A group known only from the traces
    (Flight Recorder's, without pg_config) has the size of its described siblings: fewer members is lost ones."""
    size = len(view.members)
    if view.inferred and view.desc not in ("", "undefined"):
        size = max(len(o.members) for o in views.values() if o.desc == view.desc)
    lost = [m for m in view.members if m not in traced] or (untraced if size > len(view.members) else [])
    left = [m for m in view.members if view.by_rank.get(m)]
    if not left or not (lost or size > len(view.members)):
        return None
    siblings = [o for o in sibling_groups(view, views, size) if all(m in traced for m in o.members)]
    if not siblings:
        return None
    found: dict[str, list] = {}
    for r in left:
        got = _departure(view, siblings, r)
        if got is not None:
            kind, seq, key, want, matched = got
            found.setdefault(kind, [seq, view.by_rank[r][seq], key, want, matched, []])[5].append(r)
    if not found:
        return None
    kind, (seq, e, key, want, matched, ranks) = next(iter(found.items()))
    who = (_names(lost) if lost and len(lost) <= size - len(left) else f"one of {_names(lost)}" if lost
           else f"{size - len(left)} member(s)")
    what = {"op": "issued", "dtypes": "passed dtypes", "in_sizes": "passed input sizes"}[key]
    detail = (f"{what} {value_of(key, e, view.members)} where every member of the sibling groups {what.split()[0]} "
              f"{want} ({'its earlier calls on the group matched theirs' if matched else 'the same collective'}"
              f"{'; a call skipped or added shifts every later one' if key == 'op' else ''}); {who} of this group "
              f"left no trace: the transport aborts a process whose peer passes another collective, dtype or size "
              f"(Gloo: SIGABRT, no dump)")
    return Divergence(view.name, seq, e.op, kind, sorted(ranks), sorted(left), detail,
                      {"decided_by": "sibling groups", "lost_peers": lost, "expected": want,
                       "got": {str(r): value_of(key, view.by_rank[r][seq], view.members) for r in ranks}},
                      e.t_created)


_KINDS = (("op", "type_mismatch"), ("dtypes", "dtype_mismatch"), ("in_sizes", "size_mismatch"))


def _departure(view: GroupView, siblings: list[GroupView], rank: int) -> tuple | None:
    """The first of the rank's calls on the group (the last HISTORY + 1) where it issued another collective, or
    passed another dtype or size, than every sibling member did at that position, after at least one call that
    matched theirs (the siblings run this group's program; for a dtype, the same collective at that place is
    enough): (kind, seq, key, what they passed, how many earlier calls matched)."""
    matched = 0  # earlier calls that matched the siblings' in everything they agree on
    for seq in sorted(view.by_rank[rank])[-(HISTORY + 1):]:
        e = view.by_rank[rank][seq]
        agreed = False
        for key, kind in _KINDS:
            want = _unanimous(siblings, seq, key)
            if want is None:
                continue
            if value_of(key, e, view.members) != want and not (key == "op" and _renamed(siblings, seq, e)):
                # a dtype beside the same collective needs no history: stages of a pipeline pass their own
                # sizes, not their own dtypes
                return (kind, seq, key, want, matched) if matched or (key == "dtypes" and agreed) else None
            agreed = True
        matched += agreed
    return None


def _unanimous(siblings: list[GroupView], seq: int, key: str) -> str | None:
    """The one value every sibling member holding `seq` gave there, when at least two of them did."""
    values = [value_of(key, e, o.members) for o in siblings for m in o.members
              for e in [o.by_rank.get(m, {}).get(seq)] if e is not None]
    return values[0] if len(values) >= 2 and len(set(values)) == 1 and values[0] is not None else None


def _renamed(siblings: list[GroupView], seq: int, e) -> bool:
    """The siblings' call at `seq` may be this one under the name a backend records it by (Gloo's Flight
    Recorder: a reduce_scatter as all_reduce)."""
    theirs = next((t for o in siblings for m in o.members for t in [o.by_rank.get(m, {}).get(seq)] if t), None)
    return theirs is not None and same_collective(e.op, e.raw_op, theirs.op, theirs.raw_op)


def _names(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
