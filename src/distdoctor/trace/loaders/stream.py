"""Streaming load: each rank's dump is read in a worker and only its tail and the entries the analysis reads
one by one come back whole; the rest of the rank is summed up in a per-group digest that proves it agreed.

A 16 384-rank job leaves 30 million entries; the analysis only reads entries one by one where ranks part ways
(match.first_divergence walks from the largest first seq every member holds), at each rank's tail (its last
calls, pending calls) and at a few fixed places (size checks). A worker therefore keeps, of each Flight
Recorder trace: the last WINDOW entries, the last seq of every group, every entry not completed, every
send/recv, and the positions the summary names (trace/summary.py, computed on the whole trace before trimming).
For every group it sends a digest: first and last seq and one signature per seq (what the members must agree on:
op, root, sizes, dtypes, stack frames, and whether the rank finished it).

The parent (PrefixCheck) compares every rank's signatures with the first seen for each group, seq by seq, in
arrays that grow with the number of distinct seqs of a group, not with its members. Trimming is invisible to
the analysis when, for every group, every seq below where the kept windows start (start_w) was held, finished
and agreed on by every member: then the whole-set analysis would have skipped it too (its agreed prefix) and the
same entries are read. When that cannot be proven (a divergence deep in the buffer, a member that never issued,
a gap in the seqs), the set is loaded whole instead: the report is always the whole-set one. A read of a trimmed
entry (a renderer asking for more history) reloads that rank's file whole (SparseEntries).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from distdoctor.trace.coded import Entries, frozen
from distdoctor.trace.model import AGREE_ON, RankTrace, trace_problem

WINDOW = 64  # tail entries kept per rank: the analysis reads at most the last 64 (sites.MAX_RANKS, pending)
PIN_LIMIT = 4096  # more entries than this to keep besides the window (a p2p-heavy or hung-early rank): keep whole


@dataclass
class GroupDigest:
    """One rank's collectives on one group: seqs lo..hi (all of them when `contiguous`), the first seq kept
    whole (`cut`; lo when nothing was trimmed), and per seq lo..hi a signature id, odd when the rank finished it
    (local ids: `keys` of the RankDigest says what each stands for)."""
    lo: int
    hi: int
    cut: int
    contiguous: bool
    sigs: np.ndarray | None  # per seq lo..hi, unsigned, as narrow as the ids allow (None when not contiguous)


@dataclass
class RankDigest:
    rank: int
    groups: dict[str, GroupDigest] = field(default_factory=dict)
    keys: list = field(default_factory=list)  # local signature id -> the values the members must agree on
    trimmed: bool = False


class SparseColumn:
    """One field of a SparseEntries, indexed by the entry's position in the whole trace."""

    __slots__ = ("owner", "name", "values", "where")

    def __init__(self, owner: SparseEntries, name: str) -> None:
        self.owner, self.name = owner, name
        self.values, self.where = owner.held.column(name), owner.where

    def __len__(self) -> int:
        return self.owner.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return list(self.take(range(*i.indices(self.owner.n))))
        k = self.where.get(i) if self.where is not None else None  # (a position held: the common case)
        return self.values[k] if k is not None else self.owner.value(i, self.name)

    def take(self, positions) -> tuple:
        """The values at `positions` (in one pass when all are held, as the analysis's reads are)."""
        where = self.where
        if where is not None and self.owner.where is where:  # (a miss may have reloaded the rank whole)
            held = tuple(map(where.get, positions))
            if None not in held:
                return tuple(map(self.values.__getitem__, held))
        return tuple(self[j] for j in positions)

    def __iter__(self):
        return (self[i] for i in range(self.owner.n))


class SparseEntries(Sequence):
    """A trace's entries of which only some positions are held (the rest were proven agreed, see the module's
    docstring); positions, length and values are those of the whole trace. Reading a position not held loads
    the rank's file again and keeps it whole (correct for any reader; only renderers asking for long histories
    get there)."""

    __slots__ = ("n", "positions", "where", "held", "path", "_cols")

    def __init__(self, n: int, positions: list[int] | None, held: Entries, path: str) -> None:
        self.n, self.positions, self.held, self.path = n, positions, held, path
        self.where = None if positions is None else {p: k for k, p in enumerate(positions)}  # position -> in held
        self._cols: dict[str, SparseColumn] = {}

    def __getstate__(self):
        return self.n, self.positions, self.held, self.path

    def __setstate__(self, state) -> None:
        self.__init__(*state)

    def _local(self, i: int) -> int:
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError("entry index out of range")
        if self.where is None:
            return i
        k = self.where.get(i)
        if k is not None:
            return k
        self._load_whole()
        return i

    def _load_whole(self) -> None:
        from distdoctor.trace.loaders import load_file

        whole = load_file(self.path).entries
        if len(whole) != self.n:  # the file changed under us: say so rather than mix two dumps
            raise ValueError(f"{self.path} changed while it was being diagnosed")
        self.held = Entries.of(whole)
        self.positions = self.where = None
        self._cols = {}

    def value(self, i: int, name: str):
        k = self._local(i)  # first: a miss replaces `held`
        return self.held.column(name)[k]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        k = self._local(i)  # first: a miss replaces `held`
        return self.held[k]

    def __iter__(self):
        for i in range(self.n):
            yield self[i]

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None

    def known_bounds(self, name: str) -> tuple | None:
        """Those of the entries held (model.trace_problem: the trimmed ones were checked where they were read)."""
        return self.held.known_bounds(name)

    def column(self, name: str):
        got = self._cols.get(name)
        if got is None:
            got = self._cols[name] = SparseColumn(self, name)
        return got


def window_of(trace, summary) -> tuple[list[int] | None, RankDigest | None]:
    """The positions of a Flight Recorder trace to keep whole (None: all of them) and its digest (None: not a
    Flight Recorder trace, which the streaming load cannot vouch for)."""
    if not trace.source.startswith("flight_recorder"):
        return None, None
    n = len(trace.entries)
    digest = RankDigest(trace.rank)
    sig_of, finished = _signatures(trace, digest)
    keep = set(range(max(0, n - WINDOW), n))
    keep.update(summary.not_done, summary.p2p, summary.size_checks)
    keep.update(i for i in (summary.last_done, summary.last_done_collective) if i is not None)
    # (a trace whose numbers are impossible stays whole: the parent names its problem from the entries it holds)
    trim = len(keep) <= WINDOW + PIN_LIMIT and trace_problem(trace) is None
    tail = n - WINDOW
    for group, index in summary.by_group.items():
        seqs = np.fromiter(index.keys(), np.int64, len(index))
        pos = np.fromiter(index.values(), np.int64, len(index))
        lo, hi = int(seqs.min()), int(seqs.max())
        ordered = bool(np.all(np.diff(seqs) > 0) and np.all(np.diff(pos) > 0))
        if not (ordered and hi - lo + 1 == len(seqs)):  # not provable: every entry of the group stays
            keep.update(pos.tolist())
            digest.groups[group] = GroupDigest(lo, hi, lo, False, None)
            continue
        done = finished[pos] | (seqs < summary.last_completed.get(group, lo - 1))
        first = min(int(np.searchsorted(pos, tail)), len(seqs) - 1) if trim else 0
        # (the group's last seq always stays: a member that issued on it is never shown as one that did not)
        keep.update(pos[first:].tolist())
        digest.groups[group] = GroupDigest(lo, hi, int(seqs[first]), True, _narrow(sig_of[pos] * 2 + done))
    if not trim or len(keep) >= n:
        for g in digest.groups.values():
            g.cut = g.lo
        return None, digest
    digest.trimmed = True
    return sorted(keep), digest


def _narrow(ids: np.ndarray) -> np.ndarray:
    """Small non-negative ids in the narrowest unsigned type: a digest travels from every rank to the parent
    (a 2000-entry rank's ids take 2 kB as bytes, 16 kB as int64)."""
    top = int(ids.max()) if len(ids) else 0
    for kind in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(kind).max:
            return ids.astype(kind)
    return ids


def _signatures(trace, digest: RankDigest) -> tuple[np.ndarray, np.ndarray]:
    """Per entry a local id of what the members of a group must agree on (AGREE_ON, and frames), and whether
    the entry completed; `digest.keys` gets the values of the ids. One key per distinct (row, frame list)."""
    c = Entries.of(trace.entries)
    codes = c.codes
    stacks: list = [()]
    if c.stacks is not None:
        stacks = [frozen(stack) for stack in c.stacks]
        codes = codes * len(stacks) + c.stack_codes
    pairs, inverse = np.unique(codes, return_inverse=True)
    local: dict = {}
    ids = []
    for pair in pairs.tolist():
        row, stack = c.rows[pair // len(stacks)], stacks[pair % len(stacks)]
        key = (*(frozen(getattr(row, name)) for name in AGREE_ON), stack)
        ids.append(local.setdefault(key, len(local)))
    digest.keys = list(local)
    done = np.array([row.state == "completed" for row in c.rows] or [False])
    return np.array(ids or [0], np.int64)[inverse.reshape(-1)], done[c.codes]


class PrefixCheck:
    """Parent side: every rank's digest against the first signature seen per (group, seq)."""

    def __init__(self) -> None:
        self.ids: dict = {}  # signature value -> global id
        self.ref: dict[str, tuple[int, np.ndarray]] = {}  # group -> (first seq, global signature per seq, -1 unknown)
        self.bad: dict[str, int] = {}  # group -> lowest seq where two holders differ (signature or finished)
        self.unfinished: dict[str, int] = {}  # group -> lowest seq some holder has not finished
        self.spans: dict[str, list[tuple]] = {}  # group -> (rank, lo, hi, cut, contiguous) per holder
        self.trimmed = False
        self.whole_only: list[str] = []  # files loaded whole without a digest (not Flight Recorder dumps)
        self.members: dict = {}  # long member lists, one per distinct membership (members_back)
        self._tables: dict[tuple, np.ndarray] = {}  # a digest's signature values -> their global ids
        self._last: dict[str, tuple] = {}  # group -> the last digest compared (its table, span and signatures)
        _SENT_MEMBERS.clear()  # a new load: workers forked from here (or this process) send each list again

    def add(self, d: RankDigest) -> None:
        self.trimmed |= d.trimmed
        keys = tuple(d.keys)
        table = self._tables.get(keys)
        if table is None:
            table = self._tables[keys] = np.array([self.ids.setdefault(k, len(self.ids)) for k in keys] or [0],
                                                  np.int64)
        for group, g in d.groups.items():
            self.spans.setdefault(group, []).append((d.rank, g.lo, g.hi, g.cut, g.contiguous))
            if g.sigs is None:
                continue
            # The members of a group mostly send the very digest another member sent: once one was compared,
            # every seq of its span is known in `ref` and stays as it is, so an equal one changes nothing.
            same = (keys, g.lo, g.hi, g.sigs.tobytes())
            if self._last.get(group) == same:
                continue
            self._last[group] = same
            sigs = table[g.sigs >> 1] * 2 + (g.sigs & 1).astype(np.int64)
            not_done = np.flatnonzero((sigs & 1) == 0)
            if len(not_done):
                self._lower(self.unfinished, group, g.lo + int(not_done[0]))
            base, ref = self.ref.get(group, (g.lo, np.empty(0, np.int64)))
            new_base, new_end = min(base, g.lo), max(base + len(ref), g.hi + 1)
            if new_base != base or new_end != base + len(ref):
                grown = np.full(new_end - new_base, -1, np.int64)
                grown[base - new_base:base - new_base + len(ref)] = ref
                base, ref = new_base, grown
                self.ref[group] = (base, ref)
            part = ref[g.lo - base:g.hi + 1 - base]
            known = part >= 0
            differ = np.flatnonzero(known & (part != sigs))
            if len(differ):
                self._lower(self.bad, group, g.lo + int(differ[0]))
            part[~known] = sigs[~known]

    @staticmethod
    def _lower(table: dict, group: str, seq: int) -> None:
        if seq < table.get(group, seq + 1):
            table[group] = seq

    def proven(self, ts) -> str | None:
        """None when trimming cannot change what the analysis reads; else why not (the set is loaded whole)."""
        for group, spans in self.spans.items():
            start_full = max(s[1] for s in spans)
            start_w = max(s[3] for s in spans)
            if all(s[3] == s[1] for s in spans):
                continue  # nothing trimmed on this group
            if self.bad.get(group, start_w) < start_w:
                return f"group {group!r}: members differ at seq {self.bad[group]}, before the kept windows"
            if self.unfinished.get(group, start_w) < start_w:
                return f"group {group!r}: seq {self.unfinished[group]} unfinished before the kept windows"
            if start_w == start_full:
                continue
            holders = {s[0] for s in spans}
            for rank, lo, hi, cut, contiguous in spans:
                if not contiguous or lo > start_full or hi < start_w - 1:
                    return f"group {group!r}: rank {rank} does not hold every seq before the kept windows"
            members: set = set()  # as the analysis's view has them: every trace's statement (one, once inferred)
            for info in {id(i.ranks): i.ranks for t in map(ts.ranks.get, holders)
                         if (i := t.groups.get(group)) is not None}.values():
                members.update(info)
            for rank in members - holders:
                if rank in ts.ranks:
                    return f"group {group!r}: member {rank} never issued on it"
        return None


def windowed_summary(summary, digest: RankDigest):
    """The summary as the analysis sees the trimmed trace: each group's seqs from its first kept one."""
    by_group = {}
    for group, index in summary.by_group.items():
        g = digest.groups[group]
        if g.cut <= g.lo:  # nothing cut (every group whose seqs are not contiguous and ordered)
            by_group[group] = dict(index)
        else:  # seqs lo..hi in entry order (window_of proved it): those from the cut on are the last items
            by_group[group] = dict(itertools.islice(index.items(), g.cut - g.lo, None))
    return replace(summary, by_group=by_group)


# A group's member list is world-sized (the default group of 16 384 ranks) and every rank's dump repeats it: a
# worker sends each distinct long list once (the first trace it loads that names it), later traces a key to it.
LONG_MEMBERS = 256
_SENT_MEMBERS: set = set()


def members_by_key(trace: RankTrace) -> None:
    for g in trace.groups.values():
        if len(g.ranks) > LONG_MEMBERS:
            # (a list parsed from a dump's text carries its key: no pass over the world per trace)
            key = getattr(g.ranks, "key", None) or ("members", len(g.ranks), hash(tuple(g.ranks)))
            if key in _SENT_MEMBERS:
                g.ranks = key
            else:
                _SENT_MEMBERS.add(key)
                g.desc = (g.desc, key)  # the list itself travels, named by its key


def members_back(trace: RankTrace, members: dict) -> None:
    """The parent side of members_by_key: every trace shares one list per distinct membership."""
    for g in trace.groups.values():
        if isinstance(g.desc, tuple):
            g.desc, key = g.desc
            g.ranks = members.setdefault(key, g.ranks)
        elif isinstance(g.ranks, tuple):
            g.ranks = members[g.ranks]
