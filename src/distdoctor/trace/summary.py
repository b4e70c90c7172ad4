"""Per-rank facts the analysis needs about every entry, found in one pass over a trace's columns.

A thousand-rank set holds millions of entries. The analysis reads entries one by one only where ranks part
ways; everything it needs about all the others (which collective each group's sequence numbers point at,
what completed, which entries are pending or point-to-point, how far each rank got) is gathered here, once per
rank, and when loading in parallel, in the load workers. A summary describes the trace as loaded: traces are
not changed after loading.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from distdoctor.trace.model import RankTrace


@dataclass
class TraceSummary:
    by_group: dict[str, dict[int, int]] = field(default_factory=dict)  # collectives: group -> seq -> position
    last_completed: dict[str, int] = field(default_factory=dict)  # group -> highest seq whose entry completed
    completed: dict[str, int] = field(default_factory=dict)  # group -> completed entries with a seq
    last_done_collective: int | None = None  # position of the last completed entry with a seq
    last_done: int | None = None  # position of the last completed entry of any kind
    not_done: list[int] = field(default_factory=list)  # positions of entries not marked completed
    p2p: list[int] = field(default_factory=list)  # positions of sends and receives
    groups: set[str] = field(default_factory=set)  # every group the rank issued on
    size_checks: list[int] = field(default_factory=list)  # first all_gather/reduce_scatter of each (group, op, sizes)
    steps: tuple[int, int] | None = None  # (steps completed, collectives per step) when periodic


def summarize(trace: RankTrace) -> TraceSummary:
    """The trace's summary, computed on first use and kept with it."""
    if trace.summary is None:
        trace.summary = _compute(trace)
    return trace.summary


def _compute(trace: RankTrace) -> TraceSummary:
    coded = getattr(trace.entries, "coded", None)
    if coded is not None and isinstance(coded.seq, tuple):  # the scanner's arrays: no loop per entry
        return _compute_coded(coded)
    if coded is not None:  # the per-entry reader's lists: as arrays, when every value fits int64
        seq = int_arrays(coded.seq)
        if seq is not None:
            return _compute_coded(replace(coded, seq=seq))
    s = TraceSummary()
    groups, seqs, ops, states = (trace.column(n) for n in ("group", "seq", "op", "state"))
    in_sizes, out_sizes = trace.column("in_sizes"), trace.column("out_sizes")
    by_group, completed, not_done, p2p = s.by_group, s.completed, s.not_done, s.p2p
    sigs: list[tuple[str, str]] = []  # (group, op) of each entry with a seq, for the step period
    seen_sizes: set = set()
    for i, group, seq, op, state in zip(range(len(ops)), groups, seqs, ops, states):
        done = state == "completed"
        if done:
            s.last_done = i
        else:
            not_done.append(i)
        if seq is not None:
            sigs.append((group, op))
            if done:
                completed[group] = completed.get(group, 0) + 1
                s.last_done_collective = i
        if op == "send" or op == "recv":
            p2p.append(i)
            continue
        if seq is None:
            continue
        got = by_group.get(group)
        if got is None:
            got = by_group[group] = {}
        got[seq] = i
        if op == "all_gather" or op == "reduce_scatter":
            key = (group, op, id(in_sizes[i]), id(out_sizes[i]))  # sizes are shared lists: ids stand for values
            if key not in seen_sizes:
                seen_sizes.add(key)
                s.size_checks.append(i)
    s.groups = set(groups)
    for group, positions in by_group.items():
        # A repeated seq keeps its last entry (as the mapping does); completion is judged on those entries.
        done_seqs = [seq for seq, i in positions.items() if states[i] == "completed"]
        if done_seqs:
            s.last_completed[group] = max(done_seqs)
    s.steps = _steps(sigs, sum(completed.values()))
    return s


def _compute_coded(c) -> TraceSummary:
    """_compute on a CodedEntries with array sequence numbers (trace/coded.py), with numpy: the same summary
    (tests/doctor compare the two)."""
    import numpy as np

    s = TraceSummary()
    codes, rows = c.codes, c.rows
    n = len(codes)
    if n == 0:
        return s
    group_ids = {name: i for i, name in enumerate(dict.fromkeys(r[0] for r in rows))}
    names = list(group_ids)
    gid = np.array([group_ids[r[0]] for r in rows])[codes]
    done = np.array([r[7] == "completed" for r in rows])[codes]
    sendrecv = np.array([r[1] in ("send", "recv") for r in rows])[codes]
    values, unknown = c.seq
    has_seq = ~(unknown | np.array(c.p2p_rows)[codes])  # the model's seq is None for p2p-flagged entries
    at = np.flatnonzero(done)
    s.last_done = int(at[-1]) if len(at) else None
    s.not_done = np.flatnonzero(~done).tolist()
    at = np.flatnonzero(has_seq & done)
    s.last_done_collective = int(at[-1]) if len(at) else None
    counts = np.bincount(gid[at], minlength=len(names))
    for g in _in_order_of_appearance(gid[at]):
        s.completed[names[g]] = int(counts[g])
    s.p2p = np.flatnonzero(sendrecv).tolist()
    eligible = np.flatnonzero(has_seq & ~sendrecv)
    egid = gid[eligible]
    for g in _in_order_of_appearance(egid):
        positions = eligible[egid == g]
        got = s.by_group[names[g]] = dict(zip(values[positions].tolist(), positions.tolist()))
        last = np.fromiter(got.values(), np.intp, len(got))  # a repeated seq keeps its last entry
        finished = done[last]
        if finished.any():
            s.last_completed[names[g]] = int(np.fromiter(got, np.int64, len(got))[finished].max())
    # The first all_gather/reduce_scatter of each (group, op, sizes): sizes are shared lists, ids stand for values.
    size_keys: dict = {}
    row_key = np.array([size_keys.setdefault((r[0], r[1], id(r[3]), id(r[4])), len(size_keys))
                        if r[1] in ("all_gather", "reduce_scatter") else -1 for r in rows])[codes]
    checked = eligible[row_key[eligible] >= 0]
    _, first = np.unique(row_key[checked], return_index=True)
    s.size_checks = np.sort(checked[first]).tolist()
    s.groups = set(names)
    sig_ids: dict = {}
    sig = np.array([sig_ids.setdefault((r[0], r[1]), len(sig_ids)) for r in rows])[codes][has_seq]
    s.steps = _steps(sig.tolist(), len(at))  # (group, op) ids stand for the pairs
    return s


def int_arrays(values: list):
    """(int64 values, unknown mask) of a list of ints and None, as the scanner gives them; None when one does not
    fit (a corrupt dump: the per-entry loop takes it)."""
    import numpy as np

    try:
        if None not in values:
            return np.array(values, np.int64), np.zeros(len(values), bool)
        return (np.array([0 if v is None else v for v in values], np.int64),
                np.fromiter((v is None for v in values), bool, len(values)))
    except (OverflowError, TypeError, ValueError):
        return None


def _in_order_of_appearance(ids) -> list[int]:
    import numpy as np

    values, first = np.unique(ids, return_index=True)
    return values[np.argsort(first)].tolist()


def _steps(sigs: list, done: int) -> tuple[int, int] | None:
    """Training steps when the collective sequence repeats with a period: the distance between repeats of the
    first (group, op), confirmed over the whole trace; steps = completed collectives // period."""
    if len(sigs) < 4:
        return None
    try:
        period = sigs.index(sigs[0], 1)
    except ValueError:
        return None
    if period < 2 or len(sigs) < 2 * period:
        return None
    first = sigs[:period]
    for k in range(period, len(sigs), period):  # whole periods compared at once
        chunk = sigs[k:k + period]
        if chunk != first[:len(chunk)]:
            return None
    return done // period, period
