"""Align collective entries across ranks per process group by sequence number; find each group's first divergence.

Algorithm (linear in the number of entries): for every group, index each member's collective entries by `seq`.
Flight Recorder is a ring buffer, so a rank's window may start late: comparison starts at the largest first `seq`
any member still holds. For each `seq` in order, the members holding it are compared on op, sizes, dtypes and root;
members whose last `seq` is smaller never issued it, unless their trace cannot see the call (unseen.py). Sizes are
compared through the collective specs: every member's output numel must equal `spec.out_numel(input numel, group
size)` (all_gather, reduce_scatter), and per-member input sizes must agree where the collective requires it
(all_to_all's uneven splits and scatter's root-only input are exempt). The group size is its member count where a
dump lists the members; a group known only from who issued on it (Gloo's Flight Recorder lists none) may have
members that left no dump, so its size is only known to lie between its traced members and the world
(group_size.py), and its members must then imply one size between them. Dtypes are compared as each call's distinct
dtypes (collectives/names.py `dtype_signature`): a scatter's root passes n tensors where the others pass none, and
that is one dtype, not a disagreement. The first `seq` with a mismatch or an absent member ends the scan for that
group: everything after it is a consequence. A `seq` where some members completed and others did not is a state
divergence; it is reported only when nothing structural follows it in the group.

Assumptions: the n-th collective issued on a group is the same collective on every member (NCCL's and Gloo's
rule); an entry is completed if the source says so, or if the same rank completed a later `seq` on the same
group (communicators complete in order).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from distdoctor.collectives import implied_size
from distdoctor.collectives.names import dtype_signature
from distdoctor.diagnose.group_size import size_known, size_text, sizes_fit
from distdoctor.diagnose.renamed import ambiguous_names, recorded_names, resized_alike
from distdoctor.diagnose.ties import break_tie, tied
from distdoctor.diagnose.unseen import absent_from, blind_completion, mark_unseen
from distdoctor.trace.model import AGREE_ON, Entry, TraceSet, entry_column, numel
from distdoctor.trace.summary import summarize

ROOTED = ("broadcast", "reduce", "gather", "scatter")  # collectives with a root: one can complete on some ranks only

SAME_INPUT_SIZE = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "gather", "barrier"}
SAME_OUTPUT_SIZE = {"scatter"}  # (a scatter's root passes the chunks: its input is recorded in two layouts)


class SeqEntries(Mapping):
    """One rank's collectives on one group: seq -> Entry, each entry built only when read (see trace/coded.py)."""

    __slots__ = ("index", "entries")

    def __init__(self, index: dict[int, int], entries: Sequence[Entry]) -> None:
        self.index = index  # seq -> position in the rank's entries
        self.entries = entries

    def __getitem__(self, seq: int) -> Entry:
        return self.entries[self.index[seq]]

    def get(self, seq, default=None):
        i = self.index.get(seq)
        return default if i is None else self.entries[i]

    def __contains__(self, seq) -> bool:
        return seq in self.index

    def __iter__(self):
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)

    def field(self, name: str) -> dict[int, object]:
        """seq -> one field of the entry, without building entries."""
        col = entry_column(self.entries, name)
        return {seq: col[i] for seq, i in self.index.items()}


@dataclass
class GroupView:
    name: str
    members: list[int]
    inferred: bool
    by_rank: dict[int, Mapping[int, Entry]] = field(default_factory=dict)  # rank -> seq -> entry (ranks with a trace)
    last_completed: dict[int, int] = field(default_factory=dict)  # rank -> highest completed seq
    unseen: dict[int, frozenset] = field(default_factory=dict)  # rank -> seqs its trace cannot see (RankTrace.unseen)
    outside: set[int] = field(default_factory=set)  # of those ranks, the ones in no collective at all (unseen.py)
    watched_in: dict[int, tuple] = field(default_factory=dict)  # rank -> (seq, op) its watchdog saw it in
    relation_ok: dict = field(default_factory=dict)  # cache of size-relation checks by (op, sizes identity)
    desc: str = ""  # what the user called the group (DeviceMesh dimension, group_desc), when a trace says
    world: int | None = None  # the job's size, where known: the most members a group can have
    _lowest: tuple | None = field(default=None, repr=False, compare=False)  # see least_completed_by_others
    _highest: list | None = field(default=None, repr=False, compare=False)  # see most_completed_by_others

    def hi(self, rank: int) -> int:
        seqs = self.by_rank.get(rank)
        return max(seqs) if seqs else -1

    def least_completed_by_others(self, rank: int) -> int | None:
        """The highest seq every member but `rank` completed (-2 when one left no trace); None without others.
        From the two members that completed least, found once per group."""
        if self._lowest is None:
            done = sorted((self.last_completed.get(m, -1) if m in self.by_rank else -2, m) for m in self.members)
            self._lowest = (done[:2], len(done), set(self.members))  # a set: asked once per rank
        lowest, n, members = self._lowest
        if n - (rank in members) < 1:
            return None
        return lowest[1][0] if lowest[0][1] == rank else lowest[0][0]

    def is_done(self, rank: int, entry: Entry) -> bool:
        return entry.state == "completed" or (entry.seq is not None and (
            self.last_completed.get(rank, -1) > entry.seq or self.took_part_after(rank, entry.seq)))

    def took_part_after(self, rank: int, seq: int) -> bool:
        """The rank issued the group's next collective (not a rooted one) and another member completed it: the
        rank took part in it, so it had left collective `seq`, whatever its own mark says (an async call never
        waited on; Gloo retiring an entry late). Holds under NCCL too: a stream runs a group's collectives in
        order. Without it, a rank is said to be still in #1 beside peers that completed #2-#15 with it."""
        nxt = seq + 1
        if nxt > self.most_completed_by_others(rank):
            return False
        e = self.by_rank.get(rank, {}).get(nxt)
        return e is not None and not e.is_p2p and e.op not in ROOTED

    def most_completed_by_others(self, rank: int) -> int:
        """The highest seq some member other than `rank` completed (-1 when none did)."""
        if self._highest is None:
            self._highest = sorted(((s, m) for m, s in self.last_completed.items() if m in self.by_rank),
                                   reverse=True)[:2]
        top = [s for s, m in self._highest if m != rank]
        return top[0] if top else -1


@dataclass
class Divergence:
    group: str
    seq: int
    op: str
    kind: str  # one of the finding kinds (mismatches, missing_ranks, state_mismatch)
    ranks: list[int]  # culprits / absent / stuck
    present: list[int]
    detail: str
    evidence: dict
    t: float | None = None


def build_views(ts: TraceSet) -> dict[str, GroupView]:
    views: dict[str, GroupView] = {}
    for rank, trace in ts.ranks.items():
        for name, g in trace.groups.items():
            if name not in views:
                views[name] = GroupView(name, list(g.ranks), g.inferred, desc=g.desc, world=ts.world_size)
            elif g.desc and not views[name].desc:
                views[name].desc = g.desc
        summary = summarize(trace)  # a thousand-rank set has millions of entries: most are never read one by one
        for name, seqs in summary.by_group.items():
            view = views.get(name)
            if view is None:
                view = views[name] = GroupView(name, [rank], True, world=ts.world_size)
            view.by_rank[rank] = SeqEntries(seqs, trace.entries)
            if name in summary.last_completed:
                view.last_completed[rank] = summary.last_completed[name]
        mark_unseen(views, rank, trace)
    order = {rank: k for k, rank in enumerate(ts.ranks)}  # members that left a trace, in the set's rank order
    for view in views.values():  # (not every rank against every member list: 16 384 ranks x 2 057 groups)
        for rank in sorted({r for r in view.members if r in order}, key=order.__getitem__):
            view.by_rank.setdefault(rank, {})
    return views


def _minority(values: dict[int, object], ties: bool = True) -> tuple[list[int], object, dict]:
    """Ranks outside the largest class of equal values. When several classes are largest (one rank against one),
    the count cannot tell which is wrong: every rank of the tied classes is named (ties.break_tie then weighs the
    evidence, else the finding says "one of"); the reference, the class holding the lowest rank, then only names
    the collective. `ties` False: the reference's class is taken as right even so (roots)."""
    classes: dict[object, list[int]] = {}
    if not values:
        return [], None, {}
    for rank in sorted(values):
        classes.setdefault(values[rank], []).append(rank)
    reference = max(classes, key=lambda v: (len(classes[v]), -classes[v][0]))
    top = len(classes[reference])
    tied = [v for v, rs in classes.items() if len(rs) == top]
    culprits = sorted(r for v, rs in classes.items() if (v != reference or (ties and len(tied) > 1)) for r in rs)
    return culprits, reference, {str(v): rs for v, rs in classes.items()}


def _uniform(present: dict[int, Entry], view: GroupView) -> bool:
    """Fast path: every member passed the very same op, sizes, dtypes and root (loaders share equal size and
    dtype lists between entries, so this is mostly identity checks), and the sizes obey the spec's relation."""
    it = iter(present.values())
    ref = next(it)
    op, ins, outs, dts, out_dts, root = ref.op, ref.in_sizes, ref.out_sizes, ref.in_dtypes, ref.out_dtypes, ref.root
    for e in it:
        if e.op != op or e.root != root or (e.in_sizes is not ins and e.in_sizes != ins) or \
                (e.in_dtypes is not dts and e.in_dtypes != dts) or (e.out_sizes is not outs and e.out_sizes != outs) \
                or (e.out_dtypes is not out_dts and e.out_dtypes != out_dts):
            return False
    return sizes_fit(view, op, ins, outs)


def _compare(view: GroupView, seq: int, present: dict[int, Entry]) -> list[Divergence]:
    if _uniform(present, view):
        return []
    out: list[Divergence] = []
    t = min((e.t_created for e in present.values() if e.t_created), default=None)
    # A backend may record one collective under another's name (Gloo: reduce_scatter as all_reduce): compare
    # the names as that backend's Flight Recorder would give them, when one of the traces is its.
    ops = {r: e.op for r, e in present.items()}
    seen_as = recorded_names(present)
    culprits, ref_op, classes = _minority(seen_as)
    if culprits and (sized := resized_alike(present, seen_as)):  # one name as the backend records it
        why = f"elements in: {_who(sized[1])}; {ambiguous_names(present, seen_as)}"
        return [Divergence(view.name, seq, str(ref_op), "size_mismatch", sized[0], sorted(present), why, {}, t)]
    if culprits:
        why = "; ".join(filter(None, (_who(classes), ambiguous_names(present, seen_as))))
        out.append(Divergence(view.name, seq, str(ref_op), "type_mismatch", culprits, sorted(present),
                              why, _tie_marked({"ops": classes}, "op", classes), t))
        return out  # different collectives: comparing their sizes would say nothing more
    holders = sorted(present)
    if len(set(ops.values())) > 1:  # one call seen under two names: its sizes are recorded differently too
        by_name: dict[str, dict[int, Entry]] = {}
        for r, e in present.items():
            by_name.setdefault(e.op, {})[r] = e
        for part in by_name.values():
            out.extend(_compare_sizes(view, seq, part, t, holders))
    else:
        out.extend(_compare_sizes(view, seq, present, t, holders))
    op = next((o for o in ops.values() if o != ref_op), str(ref_op))  # the program's name, where a trace has it
    return out + _compare_meta(view, seq, op, present, t, holders)


def _compare_sizes(view: GroupView, seq: int, present: dict[int, Entry], t, holders: list[int]) -> list[Divergence]:
    """Sizes of members that issued the same collective under the same name."""
    out: list[Divergence] = []
    op = next(iter(present.values())).op
    size_bad: list[int] = []
    why, tie, key = "", {}, "in_sizes"
    agree = len({(repr(e.in_sizes), repr(e.out_sizes)) for e in present.values()}) == 1
    if op in ("all_gather", "reduce_scatter") and not (agree and len(present) > 1):
        # Checked across members: when every member passed the very same sizes, the transport agreed with them
        # (a DTensor's all_gather may record an output with a leading dimension of its own).
        size_bad = [r for r, e in present.items() if not sizes_fit(view, op, e.in_sizes, e.out_sizes)]
        if size_bad:
            why = (f"{op} over {size_text(view)} needs output = "
                   f"{'n x input' if op == 'all_gather' else 'input / n'}; " + "; ".join(
                       f"rank {r}: in {present[r].in_sizes} out {present[r].out_sizes}" for r in size_bad))
        elif not size_known(view):  # each fits some size: they must fit the same one
            implied = {r: implied_size(op, numel(e.in_sizes), numel(e.out_sizes)) for r, e in present.items()
                       if e.in_sizes and e.out_sizes}
            size_bad, _, classes = _minority(implied) if len(set(implied.values())) > 1 else ([], None, {})
            if size_bad:
                why = f"{op}: the members' sizes imply groups of different sizes: {_who(classes)}"
                tie = {"undecided": True} if tied(classes) else {}  # (what decides sizes does not decide this)
    if not size_bad and op == "all_to_all" and size_known(view) and len(present) == len(view.members):
        # (every member's sizes, or the elements a member that left no trace received are not counted)
        size_bad, why, tie = _unconserved(present)
    if not size_bad and op in SAME_INPUT_SIZE:
        sizes = {r: repr(e.in_sizes) for r, e in present.items() if e.in_sizes or op != "barrier"}
        bad, ref, classes = _minority(sizes)
        if bad:
            size_bad, why, tie = bad, f"input sizes: {_who(classes)}", classes
    if not size_bad and op in SAME_OUTPUT_SIZE:  # every member receives a chunk of one size: the root's
        outs = {r: repr(e.out_sizes) for r, e in present.items() if e.out_sizes}
        bad, ref, classes = _minority(outs)
        root = next((e.root for e in present.values() if e.root is not None), None)
        if bad and root in outs:  # its call errs on chunks unlike its own output: it fixes the size
            size_bad = [r for r in outs if outs[r] != outs[root]]
            why = f"output sizes: the root, rank {root}, receives {outs[root]}; {_who(classes)}"
        elif bad:
            size_bad, why, tie, key = bad, f"output sizes: {_who(classes)}", classes, "out_sizes"
    if size_bad:
        evidence = {"in_sizes": {r: present[r].in_sizes for r in present},
                    "out_sizes": {r: present[r].out_sizes for r in present}}
        if tie.get("undecided"):  # decided already that nothing decides (ties.py leaves it so)
            evidence["tie"] = {"key": key, "classes": {}, "undecided": True}
            evidence["undecided"] = True
        else:
            evidence = _tie_marked(evidence, key, tie)
        out.append(Divergence(view.name, seq, op, "size_mismatch", size_bad, holders, why, evidence, t))
    return out


def _unconserved(present: dict[int, Entry]) -> tuple[list[int], str, dict]:
    """all_to_all: each member's sizes may differ (its splits are its own), but every element one member sends,
    another receives: the members' inputs add up to their outputs. Where they do not, some member passed another
    size. The member whose input alone differs from every other member's, by exactly the surplus, is it; where
    nothing tells (outputs differ legitimately), every member is named as a tie nobody can break."""
    if not all(e.in_sizes and e.out_sizes for e in present.values()):
        return [], "", {}
    ins = {r: numel(e.in_sizes) for r, e in present.items()}
    outs = {r: numel(e.out_sizes) for r, e in present.items()}
    surplus = sum(ins.values()) - sum(outs.values())
    if not surplus:
        return [], "", {}
    why = (f"all_to_all moves every element it is given: the members' inputs add up to {sum(ins.values())} "
           f"elements, their outputs to {sum(outs.values())}; "
           + "; ".join(f"rank {r}: in {present[r].in_sizes} out {present[r].out_sizes}" for r in sorted(present)))
    for r in ins:
        others = {v for q, v in ins.items() if q != r}
        if len(others) == 1 and ins[r] - others.pop() == surplus:
            return [r], why + f"; rank {r}'s input alone differs from the others', by exactly that surplus", {}
    return sorted(present), why + "; nothing in the traces says whose", {"undecided": True}


def _compare_meta(view: GroupView, seq: int, op: str, present: dict[int, Entry], t, holders: list[int]):
    """Dtypes and roots, which every trace records alike whatever it calls the collective."""
    out: list[Divergence] = []
    dtypes = {r: dtype_signature(e.in_dtypes, e.out_dtypes) for r, e in present.items() if e.in_dtypes or e.out_dtypes}
    bad, _, classes = _minority(dtypes) if dtypes else ([], None, {})
    if bad:
        out.append(Divergence(view.name, seq, op, "dtype_mismatch", bad, holders, f"dtypes: {_who(classes)}",
                              _tie_marked({"dtypes": classes}, "dtypes", classes), t))
    roots = {r: e.root for r, e in present.items() if e.root is not None}
    if len(roots) > 1:
        bad, _, classes = _minority(roots, ties=False)
        if bad:
            out.append(Divergence(view.name, seq, op, "root_mismatch", bad, holders,
                                  f"roots: {_who(classes)}", _tie_marked({"roots": classes}, "root", classes), t))
    return out


def _tie_marked(evidence: dict, key: str, classes: dict) -> dict:
    """The evidence, marked for ties.py when the vote was even (what was compared, and the classes)."""
    if classes and tied(classes):
        evidence["tie"] = {"key": key, "classes": {str(v): rs for v, rs in classes.items()}}
    return evidence


def _who(classes: dict) -> str:
    parts = []
    for value, ranks in sorted(classes.items(), key=lambda kv: (-len(kv[1]), kv[1][0])):
        label = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
        parts.append(f"{label} {value}")
    return "; ".join(parts)


def _run_from(seqs: list[int], off: int, start: int) -> int:
    """How many consecutive sequence numbers start, start+1, ... the sorted, distinct `seqs` hold from `off`
    (seqs[j] - j never decreases, so the run is where it equals start - off: binary search)."""
    lo, hi = off, len(seqs)
    while lo < hi:
        mid = (lo + hi) // 2
        if seqs[mid] - mid == start - off:
            lo = mid + 1
        else:
            hi = mid
    return lo - off


def agreed_prefix(view: GroupView, start: int, sorted_seqs: dict[int, list[int]]) -> int:
    """How many collectives from `start` on every member holds, completed, and agrees on (so the scan can skip
    them): proven from the entries' columns, without building entries. 0 when the proof does not apply."""
    members = list(view.by_rank.items())
    if len(members) < 2 or not all(isinstance(m, SeqEntries) and hasattr(m.entries, "column")  # (compact form)
                                   for _, m in members):
        return 0
    length = None
    for r, m in members:
        seqs = sorted_seqs[r]
        off = bisect_left(seqs, start)
        done = view.last_completed.get(r, start - 1) - start + 1
        n = min(_run_from(seqs, off, start), done)
        length = n if length is None else min(length, n)
        if length <= 1:
            return 0
    picks = {r: [m.index[s] for s in range(start, start + length)] for r, m in members}
    ref_rank, ref = members[0]
    ref_cols = {name: _take(ref.entries.column(name), picks[ref_rank]) for name in AGREE_ON}
    for r, m in members[1:]:
        for name in AGREE_ON:
            mine = _take(m.entries.column(name), picks[r])
            if mine != ref_cols[name]:
                length = min(length, next(i for i, (a, b) in enumerate(zip(mine, ref_cols[name]))
                                          if a is not b and a != b))
    # The size relation of all_gather / reduce_scatter, once per distinct (op, sizes).
    ops, ins, outs = ref_cols["op"][:length], ref_cols["in_sizes"][:length], ref_cols["out_sizes"][:length]
    for op, i_id, o_id in set(zip(ops, map(id, ins), map(id, outs))):
        if op != "all_gather" and op != "reduce_scatter":
            continue
        at = next(i for i, (a, b, c) in enumerate(zip(ops, ins, outs)) if a == op and id(b) == i_id and id(c) == o_id)
        if not sizes_fit(view, op, ins[at], outs[at]):
            length = min(length, at)
    return length


def _take(column, positions: list[int]) -> tuple:
    take = getattr(column, "take", None)  # a streamed trace's column (trace/loaders/stream.py)
    return take(positions) if take is not None else itemgetter(*positions)(column)


def first_divergence(view: GroupView) -> Divergence | None:
    """The first structural divergence of a group, else its first state divergence, else None."""
    holders = {r: seqs for r, seqs in view.by_rank.items() if seqs}
    if not holders:
        return None
    sorted_seqs = {r: sorted(seqs) for r, seqs in view.by_rank.items()}
    his = {r: (seqs[-1] if seqs else -1) for r, seqs in sorted_seqs.items()}
    start = max(sorted_seqs[r][0] for r in holders)
    end = max(his.values())
    resume = start + agreed_prefix(view, start, sorted_seqs)
    state_div: Divergence | None = None
    # Only sequence numbers some rank holds: a seq with no entry is skipped anyway, and walking the whole range
    # would never end on a corrupt dump whose seq is 10**12.
    tail: set[int] = set()
    for r in holders:
        seqs = sorted_seqs[r]
        tail.update(seqs[bisect_left(seqs, resume):])
    for seq in sorted(s for s in tail if s <= end):
        present: dict[int, Entry] = {}
        absent: list[int] = []
        for r, seqs in view.by_rank.items():
            e = seqs.get(seq)
            if e is not None:
                present[r] = e
            elif his[r] < seq:
                absent.append(r)
        if not present:
            continue
        if absent and view.unseen:
            absent = absent_from(view, seq, present, absent)
        divs = _compare(view, seq, present)
        if divs:
            return divs[0] if len(divs) == 1 else _merge(divs)
        ref = next(iter(present.values()))
        if absent:
            if state_div is not None and set(absent) <= set(state_div.ranks) and not _late_mark(view, state_div) \
                    and all(his[r] == state_div.seq for r in absent):
                # The ranks absent here are still inside an earlier collective the others completed, their last
                # call on the group: that is where the group parted ways (e.g. a broadcast whose root differs
                # between ranks completes on some of them only). Ranks that issued later collectives on the
                # group left that one (a mark that lags, an async call never waited on): they stopped here,
                # and the verdict speaks of this collective alone, not of one 15 calls back.
                state_div.evidence["then_absent_from"] = {"seq": seq, "op": ref.op, "ranks": sorted(absent)}
                return _weigh_blind(view, state_div)
            t = min((e.t_created for e in present.values() if e.t_created), default=None)
            return Divergence(view.name, seq, ref.op, "missing_ranks", sorted(absent), sorted(present), "",
                              {"issued_by": sorted(present)}, t)
        if state_div is None:
            done = [r for r, e in present.items() if view.is_done(r, e)]
            done_set = set(done)  # a list here made 16 384 members cost 2.7e8 comparisons
            stuck = [r for r in present if r not in done_set]
            if done and stuck:
                t = min((e.t_created for e in present.values() if e.t_created), default=None)
                state_div = Divergence(view.name, seq, ref.op, "state_mismatch", sorted(stuck), sorted(present),
                                       f"completed on {sorted(done)}, not on {sorted(stuck)}",
                                       {"completed": sorted(done), "stuck": sorted(stuck),
                                        "states": {r: present[r].state for r in sorted(present)}}, t)
    return _weigh_blind(view, state_div) if state_div is not None else None


def _weigh_blind(view: GroupView, d: Divergence) -> Divergence:
    """A state divergence whose completed side cannot see calls the stuck side holds (unseen.blind_completion):
    the sides made a different number of calls there; the smaller side is absent from one, an even split is said
    to be one."""
    blind = blind_completion(view, d.seq, d.evidence["completed"], d.ranks)
    if blind is None:
        return d
    evidence = {**d.evidence, "blind": {"calls": blind["calls"], "completed": d.evidence["completed"],
                                        "stuck": d.ranks, "seq": d.seq}}
    if blind["kind"] == "missing_ranks":
        seq = blind["seq"]
        holders = [r for r in view.by_rank if seq in view.by_rank[r] and r not in blind["ranks"]]
        op = view.by_rank[holders[0]][seq].op
        return Divergence(view.name, seq, op, "missing_ranks", blind["ranks"], sorted(holders), "",
                          {"issued_by": sorted(holders), **evidence}, d.t)
    evidence["tie"] = {"undecided": True, "why": "blind"}
    return Divergence(view.name, d.seq, d.op, "state_mismatch", blind["ranks"], d.present, d.detail, evidence, d.t)


def _late_mark(view: GroupView, d: Divergence) -> bool:
    """One rank shown in a collective every other member (all with a trace) completed: it is out of it, its own
    mark lags (Gloo retires an entry after the call returned) - where it stopped is the next collective."""
    return len(d.ranks) == 1 and set(view.members) <= set(view.by_rank)


def _merge(divs: list[Divergence]) -> Divergence:
    """Several mismatch kinds at one seq: keep the first as the finding, carry the others as evidence."""
    first = divs[0]
    first.evidence["also"] = [{"kind": d.kind, "ranks": d.ranks, "detail": d.detail} for d in divs[1:]]
    first.extra = divs[1:]  # type: ignore[attr-defined]
    return first


def divergences(ts: TraceSet, views: dict[str, GroupView] | None = None) -> list[Divergence]:
    views = views or build_views(ts)
    out = []
    for name in sorted(views, key=_group_key):
        d = first_divergence(views[name])
        if d is not None:
            for part in (d, *getattr(d, "extra", [])):
                break_tie(part, views[name], views)
            out.append(d)
            out.extend(getattr(d, "extra", []))
    return out


def _group_key(name: str):
    return (0, int(name), "") if name.isdigit() else (1, 0, name)
