"""A Flight Recorder dump's entries read field by field: one comprehension per column over all entries.

The row reader (flight_recorder._parse_entry) calls a function per entry and builds a tuple per entry; a 16 384-rank
set of pickles has 33 million entries, and most of the row reader's time is that per-entry overhead. Reading each
field across all entries at once does the same lookups with a fraction of the interpreter's work per value.

The columns are exactly the row reader's (the same interner, the same conversions, in `DUMP_FIELDS` order). On
any entry the fast read cannot take (not a dict, a missing key, a value of the wrong type) it returns None and
the row reader reads the dump, so a malformed entry is reported the same way, by its index.
"""

from __future__ import annotations

from distdoctor.trace.loaders.fr_coded import READ_ERRORS


def entry_columns(entries: list, interner, op_of, states: dict) -> tuple[list[list], list[tuple[int, int]],
                                                                          list[tuple[str, list]]] | None:
    """(columns in DUMP_FIELDS order, [(entry index, group-local p2p peer)], [(group, its first entry's
    process_group)] in first-seen order), or None where the row reader must read the dump."""
    try:
        return _columns(entries, interner, op_of, states)
    except READ_ERRORS:
        return None


def _columns(entries: list, interner, op_of, states: dict):
    if not all(e.__class__ is dict for e in entries):
        return None
    pgs = [e["process_group"] for e in entries]
    gget, group_of = interner.groups.get, interner.group
    groups = [gget(g) or group_of(g) for g in [pg[0] for pg in pgs]]
    nget = interner.names.get
    named = [nget(p) or op_of(p, interner) for p in [e["profiling_name"] for e in entries]]
    ops = [n[0] for n in named]
    profiling = [n[3] for n in named]
    is_p2p = [n[1] or bool(e.get("is_p2p")) for n, e in zip(named, entries)]
    seqs = [None if p else e.get("collective_seq_id") for p, e in zip(is_p2p, entries)]
    p2p_seqs = [e.get("p2p_seq_id") if p else None for p, e in zip(is_p2p, entries)]
    sget, size_list = interner.sizes.get, interner.size_list
    tget, str_list = interner.strs.get, interner.str_list

    def sizes(name):
        return [(sget(tuple(v[0])) if v.__class__ is list and len(v) == 1 else None) or size_list(v)
                for v in [e.get(name) for e in entries]]

    def dtypes(name):
        return [(tget(v[0]) if v.__class__ is list and len(v) == 1 else None) or str_list(v)
                for v in [e.get(name) for e in entries]]

    def seconds(name):
        return [int(v) / 1e9 if v else None for v in [e.get(name) for e in entries]]

    state_get = states.get
    state = ["completed" if e.get("retired") else state_get(e.get("state"), "issued") for e in entries]
    text_get, text = interner.strings.get, interner.text
    threads = [(text_get(t) or text(t)) if t else None for t in [e.get("thread_name") for e in entries]]
    frame_list, empty = interner.frame_list, interner.empty_frames
    frames = [frame_list(f) if f else empty for f in [e.get("frames") for e in entries]]
    n = len(entries)
    none = [None] * n
    columns = [
        [int(e.get("record_id", i)) for i, e in enumerate(entries)], groups, ops,
        [None if s is None else int(s) for s in seqs], [None if s is None else int(s) for s in p2p_seqs],
        profiling, sizes("input_sizes"), sizes("output_sizes"), dtypes("input_dtypes"), dtypes("output_dtypes"),
        list(none), list(none), list(none), state,
        seconds("time_created_ns"), seconds("time_discovered_started_ns"), seconds("time_discovered_completed_ns"),
        list(none), threads, frames,
    ]
    local_peers = [(i, nm[2]) for i, nm in enumerate(named) if nm[2] is not None]
    first: dict[str, list] = {}
    for g, pg in zip(groups, pgs):
        if g not in first:
            first[g] = pg
    return columns, local_peers, list(first.items())
