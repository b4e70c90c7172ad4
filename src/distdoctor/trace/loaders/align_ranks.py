"""Ranks of one group numbered by two authorities: recorder-only ranks against Flight Recorder ranks.

The recorder wraps torch.distributed's Python functions, so its `seq` counts the Python calls it saw; Flight
Recorder sits in the process group and numbers every collective, also those issued from C++ (DDP's gradient
buckets and initial broadcast, DTensor's functional collectives, DCP's internals). Where no rank left both
forms (merge.py then aligns a rank with itself), a recorder-only rank's k-th call is not Flight Recorder's k-th.

Per group, the recorder-only ranks are translated through one table built from the two *consensus* sequences:
per sequence number the call most recorder-only members made, and per sequence number the call most Flight
Recorder members made. The recorder's consensus is embedded in Flight Recorder's as a subsequence (the same
program makes the same Python calls in the same order; the communicator sees them among its own): each call
with a later one of the same collective and, where the two forms record them alike, the same element count.
The embedding is taken leftmost and rightmost; a call whose two places differ is ambiguous (a C++-issued call
of the same collective and size beside it): it goes where the wall clocks leave it alone (its members are in a
blocking collective together), else (below) by its own number, else it is unknown, neither present nor absent.
Every recorder-only rank is translated through the same table, by its own sequence number, so a rank that
skipped or resized a call still shows it against its peers at the same place (the consensus is the healthy
majority's, not the rank's own calls). Recorder calls beyond the embedded range keep the last offset.

The communicator's calls the recorder cannot see (Flight Recorder's calls no recorder call was placed on, unless
a merged rank's recorder saw the call) are `unseen` by the recorder-only ranks: the match rule neither compares
them there nor calls those ranks absent (diagnose/match.py); their dump reasons, exceptions and hang headers
speak for them instead. A call with two possible places that the times cannot settle takes the one with the
recorder's own number where it fits there (the numberings agree up to it, as when nothing was issued from C++
before it); else it keeps no number.
"""

from __future__ import annotations

from collections import Counter

from distdoctor.collectives import same_collective
from distdoctor.collectives.names import dtype_signature
from distdoctor.trace.frontier import Frontier, enqueued_collectives, frontiers
from distdoctor.trace.model import Entry, RankTrace, numel

# Collectives whose recorded sizes differ in layout or by rank between the two forms (a scatter's root lists n
# tensors in Flight Recorder, one in the recorder; all_to_all splits): compared by collective alone.
_LAYOUT_FREE = {"scatter", "gather", "all_to_all", "all_to_all_single", "all_gather_object", "broadcast_object_list",
                "gather_object", "scatter_object_list", "barrier"}


# How far two ranks' wall clocks may disagree (one host's clock, or hosts kept in sync)
TIME_SLACK_S = 0.05
# Beyond this many places for one call, the times are not read (each is a comparison; a long run of identical
# calls would make them quadratic): the call keeps its own number where it fits, else none.
MAX_CANDIDATES = 64


def _same_call(rec: Entry, fr: Entry, strict: bool | str = True) -> bool:
    """Whether a recorder call and a Flight Recorder call can be one: the same collective, and (strict) the same
    dtypes and element count, or ("sizes") the same element count whatever the dtypes."""
    if not same_collective(rec.op, rec.raw_op, fr.op, fr.raw_op):
        return False
    if not strict:
        return True
    a, b = dtype_signature(rec.in_dtypes, rec.out_dtypes), dtype_signature(fr.in_dtypes, fr.out_dtypes)
    if strict is True and a and b and a != b:
        return False
    if rec.op != fr.op or rec.op in _LAYOUT_FREE or not rec.in_sizes or not fr.in_sizes:
        return True
    return numel(rec.in_sizes) == numel(fr.in_sizes)


def _signature(e: Entry) -> tuple:
    return (e.op, numel(e.in_sizes) if e.in_sizes else None, dtype_signature(e.in_dtypes, e.out_dtypes))


def _consensus(traces: list[dict[str, list[Entry]]], group: str) -> dict[int, list[Entry]]:
    """seq -> the calls most of `traces` made at that number on `group` (a rank that diverged is outvoted; where
    the votes tie, every tied call: the count cannot say which is the program's)."""
    votes: dict[int, Counter] = {}
    first: dict[tuple, Entry] = {}
    for by_group in traces:
        for e in by_group.get(group, ()):
            sig = (e.seq, _signature(e))
            votes.setdefault(e.seq, Counter())[sig] += 1
            first.setdefault(sig, e)
    out = {}
    for seq, c in sorted(votes.items()):
        top = c.most_common()
        out[seq] = [first[sig] for sig, n in top if n == top[0][1]]
    return out


def _python_issued(e: Entry) -> bool:
    """A merged rank's entry its recorder saw (Flight Recorder's own keep the backend in the name: `gloo:...`)."""
    return bool(e.raw_op) and ":" not in e.raw_op


def _collectives(t: RankTrace) -> dict[str, list[Entry]]:
    out: dict[str, list[Entry]] = {}
    for e in t.entries:
        if e.seq is not None and not e.is_p2p:
            out.setdefault(e.group, []).append(e)
    return out


def _fits(recs: list[Entry], frs: list[Entry], strict: bool | str = True) -> bool:
    return any(_same_call(r, f, strict) for r in recs for f in frs)


def _leftmost(recs: list[list[Entry]], frs: list[list[Entry]], strict: bool | str = True) -> list[int]:
    out, j = [], 0
    for r in recs:
        while j < len(frs) and not _fits(r, frs[j], strict):
            j += 1
        if j == len(frs):
            break
        out.append(j)
        j += 1
    return out


def _rightmost(recs: list[list[Entry]], frs: list[list[Entry]], count: int, last: int,
               strict: bool | str = True) -> list[int]:
    """The rightmost places of recs[:count] in frs, the last no further than `last`."""
    out, j = [0] * count, last
    for i in range(count - 1, -1, -1):
        while not _fits(recs[i], frs[j], strict):
            j -= 1
        out[i] = j
        j -= 1
    return out


def _by_time(recs: list[Entry], frs: list[list[Entry]], lo: int, hi: int, strict: bool | str = True) -> int | None:
    """Of the places lo..hi the call could have, the only one whose call the recorder-only rank could have been in
    together with the others (a blocking collective holds every member at once: each entered it before any left
    it, and a rank enters its next call after leaving this one; both read the host's wall clock). None when the
    times leave more than one, or cannot tell (no completion time: an NCCL call returns before it completes)."""
    rec = recs[0]
    if rec.t_created is None or rec.t_completed is None or hi - lo > MAX_CANDIDATES:
        return None
    fits = []
    for j in range(lo, hi + 1):
        f = frs[j][0]
        nxt = frs[j + 1][0].t_created if j + 1 < len(frs) else None
        if not _fits(recs, frs[j], strict) or f.t_created is None:
            continue
        if f.t_created <= rec.t_completed + TIME_SLACK_S and (nxt is None or rec.t_created <= nxt + TIME_SLACK_S):
            fits.append(j)
    return fits[0] if len(fits) == 1 else None


def _same_number(seq: int, recs: list[Entry], fseqs: list[int], frs: list[list[Entry]], lo: int, hi: int,
                 strict: bool | str = True) -> int | None:
    """The place among lo..hi that has the recorder's own number, where that call fits: the two numberings agree
    up to there, as they do when nothing was issued from C++ before it (a merged rank aligned by number shows it)."""
    for j in range(lo, hi + 1):
        if fseqs[j] == seq:
            return j if _fits(recs, frs[j], strict) else None
    return None


def cross_table(rec_ref: dict[int, list[Entry]], fr_ref: dict[int, list[Entry]]) -> tuple[dict[int, int | None], set[int]]:
    """(recorder seq -> Flight Recorder seq, None where unknown; Flight Recorder seqs no recorder call holds)."""
    rseqs, fseqs = list(rec_ref), list(fr_ref)
    recs, frs = list(rec_ref.values()), list(fr_ref.values())
    if fseqs[0] > 1 or rseqs[0] > 1:
        # A ring buffer lost the group's first calls: where one window starts in the other cannot be found by
        # order. Both numberings agree when every call both hold matches; else nothing can be placed.
        if all(s not in fr_ref or _fits(rec_ref[s], fr_ref[s]) for s in rseqs) and \
                all(s in fr_ref for s in rseqs if fseqs[0] <= s <= fseqs[-1]):
            return {s: s for s in rseqs}, set(fseqs) - set(rseqs)
        return dict.fromkeys(rseqs), set(fseqs)
    left, strict = _leftmost(recs, frs), True
    hidden = _hidden_kinds(frs, left)
    open_to = [[] if _of_kinds(calls, hidden) else calls for calls in frs]
    for level in ("sizes", False):
        if len(left) == len(recs):
            break
        # A call that fits nowhere after its predecessors: one side's call of another dtype or size (a fault).
        # Placed by element count alone (another dtype), else by collective alone, the fault shows where it is
        # instead of shifting every later call; never at a call of a kind the recorder has been seen not to see
        # (one from C++, as a gradient bucket): a recorder call is none of those.
        loose = _leftmost(recs, open_to, strict=level)
        if len(loose) > len(left):
            left, strict = loose, level
    table: dict[int, int | None] = {}
    unknown: set[int] = set()
    if left:
        last = max(j for j in range(len(frs)) if _fits(recs[len(left) - 1], frs[j], strict))
        floor = -1
        for i, (lo, hi) in enumerate(zip(left, _rightmost(recs, frs, len(left), last, strict))):
            j = lo if lo == hi else _by_time(recs[i], frs, max(lo, floor + 1), hi, strict)
            if j is None and lo != hi:
                j = _same_number(rseqs[i], recs[i], fseqs, frs, max(lo, floor + 1), hi, strict)
            table[rseqs[i]] = None if j is None else fseqs[j]
            if j is None:  # a call with two possible places: the calls between them are unknown too
                unknown.update(s for s in fseqs[lo:hi + 1])
            floor = hi if j is None else j
    last_rec, last_fr = _last_pair(table)
    unknown_after = _hidden_after(fr_ref, hidden, last_fr)
    for s in rseqs[len(left):]:
        # beyond what embeds: the last offset holds, unless calls the recorder never sees came after its last
        # placed one (issued from C++): how many more came before this one, no trace says
        table[s] = None if unknown_after else last_fr + s - last_rec
    unseen = set(fseqs) - ({v for v in table.values() if v is not None} - unknown)
    return table, unseen - _seen_kinds_after(fr_ref, table, unseen)


def _hidden_kinds(frs: list[list[Entry]], left: list[int]) -> set[tuple]:
    """The kinds of call that recur in Flight Recorder's calls and that the strict placement `left` never placed a
    recorder call at: kinds the recorder does not see (issued from C++, as each step's gradient buckets). A call of
    one side's fault (another size or dtype), or one the recorder's rank has not reached yet, is a kind of its
    own, once."""
    if not left:
        return set()
    placed = {_signature(e) for j in left for e in frs[j]}
    kinds = Counter(sig for calls in frs for sig in {_signature(e) for e in calls})
    return {sig for sig, n in kinds.items() if n >= 2} - placed


def _of_kinds(calls: list[Entry], kinds: set[tuple]) -> bool:
    return bool(calls) and all(_signature(e) in kinds for e in calls)


def _hidden_after(fr_ref: dict[int, list[Entry]], hidden: set[tuple], last_fr: int) -> bool:
    """Whether Flight Recorder holds, after the recorder's last placed call, a call of a hidden kind."""
    return any(_of_kinds(fr_ref[s], hidden) for s in fr_ref if s > last_fr)


def _seen_kinds_after(fr_ref: dict[int, list[Entry]], table: dict[int, int | None], unseen: set[int]) -> set[int]:
    """The calls after the recorder's last placed one that are of a kind it always saw: a collective with an
    element count and dtypes that, up to there, the recorder saw at every place the communicator held it and never
    missed (a Python call of the program's, as a loss logged every step). A recorder-only rank whose trace ends
    before such a call never issued it, where one the recorder cannot see (issued from C++) stays unknown."""
    placed = {v for v in table.values() if v is not None}
    if not placed:
        return set()
    last = max(placed)
    kinds = {s: {_signature(e) for e in calls} for s, calls in fr_ref.items()}
    seen = set().union(*(kinds[s] for s in placed if s in kinds))
    missed = set().union(set(), *(kinds[s] for s in unseen if s <= last))
    return {s for s in unseen if s > last and kinds[s] and kinds[s] <= seen - missed}


def _last_pair(table: dict[int, int | None]) -> tuple[int, int]:
    for r in sorted(table, reverse=True):
        if table[r] is not None:
            return r, table[r]
    return 0, 0


def align_across_ranks(ranks: dict[int, RankTrace], skip: set[str]) -> dict[str, dict]:
    """Translate the recorder-only ranks' numbers on each group Flight Recorder ranks also hold (but not the
    groups in `skip`: a merged rank's own alignment translated them). Returns per group how it was done."""
    recorder = [t for t in ranks.values() if t.source == "native" and not t.merged]
    # numbered by the communicator: Flight Recorder's dumps, and the ranks merged with theirs (merge.py)
    flight = [t for t in ranks.values() if t.numbered_by_communicator]
    if not recorder or not flight:
        return {}
    rec_calls, fr_calls = [_collectives(t) for t in recorder], [_collectives(t) for t in flight]
    groups = {g for calls in rec_calls + fr_calls for g in calls} - skip
    fronts = [frontiers(t) if t.pg_status else {} for t in recorder]  # (read before the calls are renumbered)
    done: dict[str, dict] = {}
    for group in sorted(groups):
        fr_ref = _consensus(fr_calls, group)
        if not fr_ref:
            continue
        rec_ref = _consensus(rec_calls, group)
        table, unseen = cross_table(rec_ref, fr_ref) if rec_ref else ({}, set(fr_ref))
        unseen -= {e.seq for t, calls in zip(flight, fr_calls) if t.merged for e in calls.get(group, ())
                   if _python_issued(e)}  # a merged rank's recorder saw it: a recorder-only rank would have too
        for t, calls, front in zip(recorder, rec_calls, fronts):
            _apply(t, calls.get(group, ()), group, table, unseen, max(fr_ref), front.get(group))
        done[group] = {"unseen": len(unseen), "ambiguous": sum(1 for v in table.values() if v is None)}
    return done


def _is_member(t: RankTrace, group: str) -> bool:
    """Whether the rank is a member of `group`, as far as its trace says. The recorder lists every group its rank
    belongs to, used or not (recorder/ring.py): a group missing from such a list is not the rank's; where the
    trace lists none of its own, membership is unknown and counts."""
    info = (t.groups or {}).get(group)
    if info is None:
        return not any(not g.inferred for g in (t.groups or {}).values())
    return not info.ranks or t.rank in info.ranks


def unseen_of(t: RankTrace, group: str, f: Frontier | None, unseen: set[int]) -> frozenset[int]:
    """Of the calls a recorder-only rank cannot see, those it may have issued: none on a group it is not in;
    else those up to its frontier (`pg_status` of its own Flight Recorder, recorder/dumpfile.py fr_standing,
    which counts the calls issued from C++ too): a call past the last its communicator enqueued on the group
    it never issued, seen or not. Without the frontier, all of them."""
    if not _is_member(t, group):
        return frozenset()
    upto = enqueued_collectives(f)
    return frozenset(unseen if upto is None else (s for s in unseen if s <= upto))


def _apply(t: RankTrace, calls, group: str, table: dict[int, int | None], unseen: set[int], upto: int,
           front: Frontier | None = None) -> None:
    last_rec, last_fr = _last_pair(table)
    for e in calls:
        e.seq = table[e.seq] if e.seq in table else last_fr + e.seq - last_rec
    mine = unseen_of(t, group, front, unseen)
    if mine:
        t.unseen = dict(t.unseen or {})
        t.unseen[group] = frozenset(mine)
    if calls and upto:
        t.classified = {**(t.classified or {}), group: upto}
    t.summary = None
