"""A group whose other members left no trace, judged by its sibling groups (`unmet_by_siblings`): Gloo aborts a
process (SIGABRT, no dump) whose peer passes another dtype or size, so the call that changed has no member left to
be compared with but the members of the groups that run the same program beside it."""

from __future__ import annotations

from distdoctor.collectives.names import same_collective
from distdoctor.diagnose.crash import ended_on_their_own
from distdoctor.diagnose.match import Divergence, GroupView, divergences
from distdoctor.diagnose.ties import sibling_groups, value_of
from distdoctor.trace.model import TraceSet, entry_column


def all_divergences(ts: TraceSet, views: dict[str, GroupView]) -> list[Divergence]:
    """match.py's divergences, and for each group with none, what its sibling groups say of it."""
    out = divergences(ts, views)
    diverged = {d.group for d in out}
    traced = set(ts.ranks)
    untraced = [r for r in range(ts.world_size or 0) if r not in traced]
    own = set(ended_on_their_own(ts)) if untraced else set()
    last = {r: _last_issued(t.entries) for r, t in ts.ranks.items()} if untraced else {}
    for name in sorted(views):
        if name not in diverged:
            d = unmet_by_siblings(views[name], views, traced, untraced, own, last)
            if d is not None:
                out.append(d)
    return out


HISTORY = 64  # earlier calls of a group its siblings' calls must match before they vouch for the next one


def _last_issued(entries) -> float | None:
    """When the rank issued its last recorded call (None when its trace holds no time)."""
    times = [t for t in entry_column(entries, "t_created") if t is not None]
    return max(times) if times else None


def unmet_by_siblings(view: GroupView, views: dict[str, GroupView], traced: set[int], untraced: list[int],
                      own: set[int] = frozenset(), last: dict[int, float | None] | None = None) -> Divergence | None:
    """A group whose other members left no trace (Gloo aborts a process, SIGABRT and no dump, when its peer passes
    another dtype or size): the members that are left cannot be compared with them, but with the sibling groups
    (ties.py: same size and description, disjoint, the same program). Where a left member's last call on the
    group (the one its peers died in; Gloo's Flight Recorder retires a call that failed) passes another dtype or
    size than the siblings' members all passed at that position, while its earlier calls there matched theirs,
    it changed its call: the mismatch is the cause, the members without a trace its victims (no finding where
    the earlier calls differ: pipeline stages' groups legitimately do). A group known only from the traces
    (Flight Recorder's, without pg_config) has the size of its described siblings: fewer members is lost ones.
    Where the departing call is the member's first on the group, nothing vouches for the groups running alike:
    "one of" both sides (`_unvouched`) when it is the last call the member issued (`last`: the one it stands in;
    Gloo's Flight Recorder marks a failed call completed, so its state cannot say) and the member departs alone
    (two that agree against the siblings say the groups differ by design), unless the launcher's log
    says the lost members ended of their own (`own`: a kill from outside, an exit code; not Gloo's abort), which
    leaves their missing dump the cause."""
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
    if matched is None:  # its first call on the group: nothing vouches for the groups running alike
        if len(ranks) != 1 or not lost or set(lost) <= own or not _stands_in(view, ranks[0], seq, last or {}):
            return None  # (two members that agree against the siblings: their groups differ by design)
        return _unvouched(view, kind, seq, e, key, want, ranks, lost)
    who = (_names(lost) if lost and len(lost) <= size - len(left) else f"one of {_names(lost)}" if lost
           else f"{size - len(left)} member(s)")
    what = _WHAT[key]
    detail = (f"{what} {value_of(key, e, view.members)} where every member of the sibling groups {what.split()[0]} "
              f"{want} ({'its earlier calls on the group matched theirs' if matched else 'the same collective'}"
              f"{'; a call skipped or added shifts every later one' if key == 'op' else ''}); {who} of this group "
              f"left no trace: the transport aborts a process whose peer passes another collective, dtype or size "
              f"(Gloo: SIGABRT, no dump)")
    return Divergence(view.name, seq, e.op, kind, sorted(ranks), sorted(left), detail,
                      {"decided_by": "sibling groups", "lost_peers": lost, "expected": want,
                       "got": {str(r): value_of(key, view.by_rank[r][seq], view.members) for r in ranks}},
                      e.t_created)


def _stands_in(view: GroupView, rank: int, seq: int, last: dict[int, float | None]) -> bool:
    """Whether call `seq` is the last the rank issued: the one it stands in."""
    t = last.get(rank)
    return t is not None and view.by_rank[rank][seq].t_created == t


def _unvouched(view: GroupView, kind: str, seq: int, e, key: str, want: str, ranks: list[int],
               lost: list[int]) -> Divergence:
    """A left member's first call on the group differs from what the sibling groups' members all did there, and
    its peers left no trace: it may have changed its call and cost them their process (Gloo aborts the one that
    receives another size), or they may have died of their own while it waited; groups of one description may
    also differ by design (uneven shards, a pipeline's stages), and no earlier call says whether these do. The
    mismatch is "one of" the two sides, never a claim for either."""
    what = _WHAT[key]
    suspects = sorted(set(lost) | set(ranks))
    got = value_of(key, e, view.members)
    detail = (f"{_names(ranks)} {what} {got} in {'its' if len(ranks) == 1 else 'their'} first call on the group "
              f"where every member of the sibling groups {what.split()[0]} {want}, and {_names(lost)} of this group "
              f"left no trace: either the call changed and cost {'its' if len(lost) == 1 else 'their'} peer "
              f"{'its process' if len(lost) == 1 else 'their processes'} (Gloo aborts a process whose peer passes "
              f"another collective, dtype or size: SIGABRT, no dump), or {_names(lost)} died of "
              f"{'its' if len(lost) == 1 else 'their'} own while {_names(ranks)} waited; no earlier call on the "
              f"group says whether these groups run alike (uneven shards and a pipeline's stages differ by design)")
    return Divergence(view.name, seq, e.op, kind, suspects, sorted(ranks), detail,
                      {"decided_by": "sibling groups", "lost_peers": lost, "expected": want,
                       "got": {str(r): got for r in ranks}, "undecided": True, "suspects": suspects,
                       "tie": {"key": key, "classes": {}, "undecided": True, "why": "no earlier call"}},
                      e.t_created)


_WHAT = {"op": "issued", "dtypes": "passed dtypes", "in_sizes": "passed input sizes"}  # a departure, in words
_KINDS = (("op", "type_mismatch"), ("dtypes", "dtype_mismatch"), ("in_sizes", "size_mismatch"))


def _departure(view: GroupView, siblings: list[GroupView], rank: int) -> tuple | None:
    """The first of the rank's calls on the group (the last HISTORY + 1) where it issued another collective, or
    passed another dtype or size, than every sibling member did at that position, after at least one call that
    matched theirs (the siblings run this group's program; for a dtype, the same collective at that place is
    enough): (kind, seq, key, what they passed, how many earlier calls matched), with None for that count where
    the departing call is the rank's first on the group: no earlier call says whether the groups run alike."""
    matched = 0  # earlier calls that matched the siblings' in everything they agree on
    first = min(view.by_rank[rank])
    for seq in sorted(view.by_rank[rank])[-(HISTORY + 1):]:
        e = view.by_rank[rank][seq]
        agreed = False
        for key, kind in _KINDS:
            want = _unanimous(siblings, seq, key)
            if want is None:
                continue
            if value_of(key, e, view.members) != want and not (key == "op" and _renamed(siblings, seq, e)):
                # a dtype beside the same collective needs no history: stages of a pipeline pass their own
                # sizes, not their own dtypes; the rank's first call on the group has none to ask (`_unvouched`)
                if matched or (key == "dtypes" and agreed):
                    return kind, seq, key, want, matched
                return (kind, seq, key, want, None) if seq == first else None
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
