"""One view of a rank from every trace it left: the recorder's `rank_<r>.jsonl` and Flight Recorder's dump.

The two see different halves of a job. The recorder wraps torch.distributed's Python functions: it has the
Python call sites, roots, p2p peers (Gloo's Flight Recorder records no p2p), the stacks of all threads and how
the process ended. Flight Recorder sits in the process group: it sees every collective, also those issued from
C++ (DDP's gradient buckets, its initial broadcast, FSDP internals), which the recorder never sees, and its
sequence numbers are the communicator's own. A rank's view is both, without counting any call twice.

Alignment, per group: the recorder's collectives are a subsequence of Flight Recorder's (the same calls, plus
those issued from C++). When every recorder entry finds a Flight Recorder entry of the same sequence number and
the same collective, they are paired by sequence number (the common case: nothing issued from C++). Otherwise
they are paired in order: each recorder entry with the next Flight Recorder entry of the same collective, the
same number of elements, and created no earlier than the Python call (both clocks are the host's wall clock).
The merged entry keeps Flight Recorder's sequence number (the one every rank's communicator agrees on), the
recorder's program-level facts (op name, sizes, dtypes, root, frames, thread, error, times) and the more
advanced completion of the two (Gloo marks an entry retired a moment after the call returned); under NCCL,
Flight Recorder's completion alone (the call returned when the CPU had enqueued it) and the dump's `pg_status`. Flight Recorder
entries nobody paired were issued from C++ and are kept; recorder collectives nobody paired keep their place,
without a sequence number unless both count alike. Point-to-point: the recorder's, where it has any on a group
(Flight Recorder's p2p numbering differs), else Flight Recorder's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from distdoctor.collectives import same_collective
from distdoctor.collectives.names import dtype_signature
from distdoctor.trace.frontier import frontiers, is_async
from distdoctor.trace.loaders.align_ranks import align_across_ranks, unseen_of
from distdoctor.trace.model import Entry, GroupInfo, RankTrace, numel

# A Flight Recorder entry is created inside the call the recorder saw begin: never earlier than it, up to clock
# granularity. Generous, since a loaded host can be slow to enqueue.
CLOCK_SLACK_S = 0.5
_ORDER = {"issued": 0, "started": 1, "completed": 2}


def _compatible(rec: Entry, fr: Entry, timed: bool = True, sizes: bool = True) -> bool:
    """Can Flight Recorder's `fr` be the call the recorder saw as `rec`? (`timed`: both are of one process, so
    Flight Recorder's entry cannot predate the call; `sizes`: both are of one process, so the sizes agree.)"""
    if not same_collective(rec.op, rec.raw_op, fr.op, fr.raw_op):
        return False
    a, b = dtype_signature(rec.in_dtypes, rec.out_dtypes), dtype_signature(fr.in_dtypes, fr.out_dtypes)
    if a and b and a != b:
        return False  # one process's call has one dtype in both forms
    if sizes and rec.op == fr.op and rec.in_sizes and fr.in_sizes and numel(rec.in_sizes) != numel(fr.in_sizes):
        return False  # sizes differ in layout between the two ([[8]] vs [[2, 4]]), never in element count
    if timed and rec.t_created is not None and fr.t_created is not None and \
            fr.t_created < rec.t_created - CLOCK_SLACK_S:
        return False
    return True


def _by_seq(recs: list[Entry], frs: list[Entry], timed: bool = True, sizes: bool = True) -> dict[int, int] | None:
    """Pairs (recorder position -> Flight Recorder position) by sequence number, when every recorder entry the
    Flight Recorder window covers has its same-numbered, compatible partner; else None."""
    at = {e.seq: i for i, e in enumerate(frs)}  # a coalesced block repeats a seq: its marker (the last) wins
    lo, hi = min(at), max(at)
    pairs: dict[int, int] = {}
    for i, r in enumerate(recs):
        j = at.get(r.seq)
        if j is None:
            if r.seq < lo or r.seq > hi:
                continue  # older than Flight Recorder's ring buffer holds, or never reached its process group
            return None
        if not _compatible(r, frs[j], timed, sizes):
            return None
        pairs[i] = j
    return pairs


def _in_order(recs: list[Entry], frs: list[Entry], timed: bool = True) -> dict[int, int]:
    pairs: dict[int, int] = {}
    j = 0
    for i, r in enumerate(recs):
        k = j
        while k < len(frs) and not _compatible(r, frs[k], timed):
            k += 1
        if k < len(frs):
            pairs[i] = k
            j = k + 1
    return pairs


def _collectives_by_group(entries: list[Entry]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, e in enumerate(entries):
        if e.seq is not None and not e.is_p2p:
            out.setdefault(e.group, []).append(i)
    return out


def _combine(rec: Entry, fr: Entry, seq: int | None, asynchronous: bool = False) -> Entry:
    """The recorder's view of the call, with Flight Recorder's sequence number and the further completion; under
    NCCL (`asynchronous`) Flight Recorder's completion alone: the Python call returned once the CPU had enqueued
    it, which says nothing of the GPU."""
    state = rec.state
    if rec.error is None and (asynchronous or _ORDER[fr.state] > _ORDER[state]):
        state = fr.state  # a failed call stays failed whatever Flight Recorder marked
    return dataclasses.replace(
        rec, seq=seq, state=state,
        frames=rec.frames or fr.frames,
        t_started=rec.t_started if rec.t_started is not None else fr.t_started,
        t_completed=rec.t_completed if rec.t_completed is not None else fr.t_completed)


def merge_rank(rec: RankTrace, fr: RankTrace) -> RankTrace:
    """One RankTrace from a rank's recorder trace and its Flight Recorder dump (see the module docstring)."""
    recs, frs = list(rec.entries), list(fr.entries)
    asynchronous = is_async(fr)
    rec_p2p_groups = {e.group for e in recs if e.is_p2p}
    pairs: dict[int, tuple[int, int | None]] = {}  # recorder position -> (FR position, seq)
    unnumbered: set[int] = set()  # recorder collectives kept without a sequence number
    aligned_by: dict[str, str] = {}
    seq_map: dict[str, list[list[int]]] = {}  # group -> [recorder seq, Flight Recorder seq] where they differ
    rec_by_group, fr_by_group = _collectives_by_group(recs), _collectives_by_group(frs)
    for group, r_pos in sorted(rec_by_group.items()):
        f_pos = fr_by_group.get(group)
        if not f_pos:
            continue  # Flight Recorder saw nothing of this group: the recorder's numbering stands
        r_ent, f_ent = [recs[i] for i in r_pos], [frs[j] for j in f_pos]
        got = _by_seq(r_ent, f_ent)
        aligned_by[group] = "seq" if got is not None else "order"
        if got is None:
            got = _in_order(r_ent, f_ent)
            for k in range(len(r_pos)):
                if k not in got:
                    unnumbered.add(r_pos[k])  # its number counts other calls than Flight Recorder's
        for k, m in got.items():
            pairs[r_pos[k]] = (f_pos[m], f_ent[m].seq)
        if aligned_by[group] == "order":
            seq_map[group] = [[r_ent[k].seq, f_ent[m].seq] for k, m in sorted(got.items())]
    fr_paired = {j for j, _ in pairs.values()}
    threads = Counter((frs[j].stream, recs[i].stream) for i, (j, _) in pairs.items())
    thread_of = {}
    for (f_thread, r_thread), _ in threads.most_common():
        thread_of.setdefault(f_thread, r_thread)

    merged: list[Entry] = []
    by_fr = {j: i for i, (j, _) in pairs.items()}
    done = [False] * len(recs)
    ri = 0

    def take_recorder_until(stop: int) -> None:
        nonlocal ri
        while ri < stop:
            if not done[ri] and ri not in pairs:
                e = recs[ri]
                merged.append(dataclasses.replace(e, seq=None) if ri in unnumbered else e)
                done[ri] = True
            ri += 1

    for j, f in enumerate(frs):
        i = by_fr.get(j)
        if i is not None:
            take_recorder_until(i)
            merged.append(_combine(recs[i], f, pairs[i][1], asynchronous))
            done[i] = True
            ri = max(ri, i + 1)
        elif j not in fr_paired and not (f.is_p2p and f.group in rec_p2p_groups):
            merged.append(dataclasses.replace(f, stream=thread_of.get(f.stream, f.stream)))  # issued from C++
    take_recorder_until(len(recs))
    for i, e in enumerate(merged):
        e.index = i  # positions in the merged order: which entry on a thread is older

    groups = {name: dataclasses.replace(g) for name, g in fr.groups.items()}
    for name, g in rec.groups.items():
        old = groups.get(name)
        groups[name] = GroupInfo(name, list(g.ranks), g.inferred, g.desc or (old.desc if old else ""))
    fr_only = sum(1 for j, f in enumerate(frs) if j not in fr_paired and not (f.is_p2p and f.group in rec_p2p_groups))
    return dataclasses.replace(
        rec, source=f"{rec.source}+{fr.source}", groups=groups, entries=merged, summary=None,
        world_size=rec.world_size or fr.world_size, pg_status=fr.pg_status, comm_lib_version=fr.comm_lib_version,
        merged={"paths": [rec.path, fr.path], "paired": len(pairs), "flight_recorder_only": fr_only,
                "recorder_only": len(recs) - len(pairs), "aligned_by": aligned_by, "seq_map": seq_map})


def renumber_recorder_only(ranks: dict[int, RankTrace]) -> None:
    """A rank that left only its recorder trace, in a job where C++ issued collectives the recorder does not see
    (DDP): its sequence numbers count fewer calls than its peers' communicators did. On a group a merged rank
    aligned with itself, translate them through that alignment (the same program makes the same Python calls in
    the same order): the k-th Python collective on a group gets the number the merged rank's k-th one got;
    beyond the aligned range, the last offset holds. Calls only C++ issued stay unknown for that rank (neither
    present nor absent: RankTrace.unseen). On a group no rank left both forms of, through the recorder-only
    ranks' consensus embedded in the Flight Recorder ranks' (align_ranks.py)."""
    maps: dict[str, tuple[int, dict[int, int], list[int], frozenset[int]]] = {}
    for rank, t in sorted(ranks.items()):
        for group, pairs in ((t.merged or {}).get("seq_map") or {}).items():
            if group not in maps and pairs:
                maps[group] = (rank, {a: b for a, b in pairs}, pairs[-1], _cpp_only(t, group, pairs))
    across = align_across_ranks(ranks, set(maps))
    for rank, t in ranks.items():
        if t.merged or t.source != "native":
            continue
        front = frontiers(t) if t.pg_status else {}
        done: dict[str, object] = {}
        for group, positions in _collectives_by_group(list(t.entries)).items():
            got = maps.get(group)
            if got is None:
                continue
            via, table, (last_rec, last_fr), unseen = got
            for i in positions:
                e = t.entries[i]
                e.seq = table.get(e.seq, last_fr + e.seq - last_rec if e.seq > last_rec else None)
            done[group] = via
            unseen = unseen_of(t, group, front.get(group), unseen)
            if unseen:
                t.unseen = {**(t.unseen or {}), group: unseen}
            t.classified = {**(t.classified or {}), group: last_fr}
        placed = sorted(g for g in across if g in (t.unseen or {}) or any(e.group == g for e in t.entries))
        if done or placed:
            t.summary = None
            t.merged = {"paths": [t.path], "renumbered_through": done}
            if placed:
                t.merged["placed_among_flight_recorder"] = {  # (this rank's unseen calls: its frontier trims them)
                    g: {**across[g], "unseen": len((t.unseen or {}).get(g, ()))} for g in placed}


def _cpp_only(t: RankTrace, group: str, pairs: list[list[int]]) -> frozenset[int]:
    """The merged rank's collectives on `group` its recorder did not see (issued from C++)."""
    paired = {b for _, b in pairs}
    return frozenset(e.seq for e in t.entries if e.group == group and e.seq is not None and not e.is_p2p
                     and e.seq not in paired)
