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
of the same collective and size beside it) and keeps no number: it is unknown, neither present nor absent.
Every recorder-only rank is translated through the same table, by its own sequence number, so a rank that
skipped or resized a call still shows it against its peers at the same place (the consensus is the healthy
majority's, not the rank's own calls). Recorder calls beyond the embedded range keep the last offset.

The communicator's calls the recorder cannot see (Flight Recorder's calls no recorder call was placed on) are
`unseen` by the recorder-only ranks: the match rule neither compares them there nor calls those ranks absent
(diagnose/match.py); their dump reasons, exceptions and hang headers speak for them instead.
"""

from __future__ import annotations

from collections import Counter

from distdoctor.collectives import same_collective
from distdoctor.collectives.names import dtype_signature
from distdoctor.trace.model import Entry, RankTrace, numel

# Collectives whose recorded sizes differ in layout or by rank between the two forms (a scatter's root lists n
# tensors in Flight Recorder, one in the recorder; all_to_all splits): compared by collective alone.
_LAYOUT_FREE = {"scatter", "gather", "all_to_all", "all_to_all_single", "all_gather_object", "broadcast_object_list",
                "gather_object", "scatter_object_list", "barrier"}


# Two ranks enter one collective within this of each other when both clocks are the host's (or well synced)
TIME_SLACK_S = 1.0


def _same_call(rec: Entry, fr: Entry) -> bool:
    if not same_collective(rec.op, rec.raw_op, fr.op, fr.raw_op):
        return False
    a, b = dtype_signature(rec.in_dtypes, rec.out_dtypes), dtype_signature(fr.in_dtypes, fr.out_dtypes)
    if a and b and a != b:
        return False
    if rec.op != fr.op or rec.op in _LAYOUT_FREE or not rec.in_sizes or not fr.in_sizes:
        return True
    return numel(rec.in_sizes) == numel(fr.in_sizes)


def _signature(e: Entry) -> tuple:
    return (e.op, numel(e.in_sizes) if e.in_sizes else None, dtype_signature(e.in_dtypes, e.out_dtypes))


def _consensus(traces: list[RankTrace], group: str) -> dict[int, list[Entry]]:
    """seq -> the calls most of `traces` made at that number on `group` (a rank that diverged is outvoted; where
    the votes tie, every tied call: the count cannot say which is the program's)."""
    votes: dict[int, Counter] = {}
    first: dict[tuple, Entry] = {}
    for t in traces:
        for e in t.entries:
            if e.group == group and e.seq is not None and not e.is_p2p:
                sig = (e.seq, _signature(e))
                votes.setdefault(e.seq, Counter())[sig] += 1
                first.setdefault(sig, e)
    out = {}
    for seq, c in sorted(votes.items()):
        top = c.most_common()
        out[seq] = [first[sig] for sig, n in top if n == top[0][1]]
    return out


def _fits(recs: list[Entry], frs: list[Entry]) -> bool:
    return any(_same_call(r, f) for r in recs for f in frs)


def _leftmost(recs: list[list[Entry]], frs: list[list[Entry]]) -> list[int]:
    out, j = [], 0
    for r in recs:
        while j < len(frs) and not _fits(r, frs[j]):
            j += 1
        if j == len(frs):
            break
        out.append(j)
        j += 1
    return out


def _rightmost(recs: list[list[Entry]], frs: list[list[Entry]], count: int, last: int) -> list[int]:
    """The rightmost places of recs[:count] in frs, the last no further than `last`."""
    out, j = [0] * count, last
    for i in range(count - 1, -1, -1):
        while not _fits(recs[i], frs[j]):
            j -= 1
        out[i] = j
        j -= 1
    return out


def _by_time(recs: list[Entry], frs: list[list[Entry]], lo: int, hi: int) -> int | None:
    """Of the places lo..hi the call could have, the one whose call began at the same moment on the other
    ranks (a collective holds its members together; every rank reads the host's wall clock): the nearest, when
    it is clearly nearer than the next. None when the times cannot tell."""
    t = recs[0].t_created
    if t is None:
        return None
    near = sorted((abs(frs[j][0].t_created - t), j) for j in range(lo, hi + 1)
                  if frs[j][0].t_created is not None and _fits(recs, frs[j]))
    if len(near) < 2 or near[0][0] > TIME_SLACK_S or near[0][0] * 4 > near[1][0]:
        return None
    return near[0][1]


def cross_table(rec_ref: dict[int, list[Entry]], fr_ref: dict[int, list[Entry]]) -> tuple[dict[int, int | None], set[int]]:
    """(recorder seq -> Flight Recorder seq, None where unknown; Flight Recorder seqs no recorder call holds)."""
    rseqs, fseqs = list(rec_ref), list(fr_ref)
    recs, frs = list(rec_ref.values()), list(fr_ref.values())
    if fseqs[0] > rseqs[0]:
        # Flight Recorder's ring buffer lost the group's first calls: where its window starts among the
        # recorder's cannot be found by order. Both numberings agree when every call both hold matches;
        # else nothing can be placed.
        if all(s not in fr_ref or _fits(rec_ref[s], fr_ref[s]) for s in rseqs) and \
                all(s in fr_ref for s in rseqs if fseqs[0] <= s <= fseqs[-1]):
            return {s: s for s in rseqs}, set(fseqs) - set(rseqs)
        return dict.fromkeys(rseqs), set(fseqs)
    left = _leftmost(recs, frs)
    table: dict[int, int | None] = {}
    unknown: set[int] = set()
    if left:
        last = max(j for j in range(len(frs)) if _fits(recs[len(left) - 1], frs[j]))
        floor = -1
        for i, (lo, hi) in enumerate(zip(left, _rightmost(recs, frs, len(left), last))):
            j = lo if lo == hi else _by_time(recs[i], frs, max(lo, floor + 1), hi)
            table[rseqs[i]] = None if j is None else fseqs[j]
            if j is None:  # a call with two possible places: the calls between them are unknown too
                unknown.update(s for s in fseqs[lo:hi + 1])
            floor = hi if j is None else j
    last_rec, last_fr = _last_pair(table)
    for s in rseqs[len(left):]:
        table[s] = last_fr + s - last_rec  # beyond what embeds: the last offset holds
    return table, set(fseqs) - ({v for v in table.values() if v is not None} - unknown)


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
    flight = [t for t in ranks.values() if t.source.startswith("flight_recorder") or
              "flight_recorder_only" in (t.merged or {})]
    if not recorder or not flight:
        return {}
    groups = {e.group for t in recorder + flight for e in t.entries if e.seq is not None and not e.is_p2p} - skip
    done: dict[str, dict] = {}
    for group in sorted(groups):
        fr_ref = _consensus(flight, group)
        if not fr_ref:
            continue
        rec_ref = _consensus(recorder, group)
        table, unseen = cross_table(rec_ref, fr_ref) if rec_ref else ({}, set(fr_ref))
        for t in recorder:
            _apply(t, group, table, unseen)
        done[group] = {"unseen": len(unseen), "ambiguous": sum(1 for v in table.values() if v is None)}
    return done


def _apply(t: RankTrace, group: str, table: dict[int, int | None], unseen: set[int]) -> None:
    last_rec, last_fr = _last_pair(table)
    for e in t.entries:
        if e.group == group and e.seq is not None and not e.is_p2p:
            e.seq = table[e.seq] if e.seq in table else last_fr + e.seq - last_rec
    if unseen:
        t.unseen = dict(t.unseen or {})
        t.unseen[group] = frozenset(unseen)
    t.summary = None
