"""NCCL's semantics in the trace model: where each rank's CPU and GPU stand per process group (its frontier).

A blocking backend (Gloo, the recorder's own traces) returns from a collective when it is done: the CPU frontier
is the GPU frontier. NCCL (and XCCL) returns at once: the CPU enqueues onto one stream per process group and runs
ahead; each stream executes its group's collectives in order, and a collective completes only when every member's
stream reaches it. The order of entries across groups in a dump is the CPU's, not the GPU's.

Flight Recorder's `pg_status` (torch >= 2.5) gives, per group, the last collective the rank's CPU enqueued, the
last its GPU started (-1 unless collective timing is on) and the last it completed; a p2p-only group counts its
sends and receives there. Dumps without it (older, or a reader that drops it) get frontiers from the entries.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.trace.model import Entry, RankTrace
from distdoctor.trace.summary import summarize

_STATUS_KEYS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


def read_status(raw: object, lib_version: object) -> tuple[dict | None, str | None]:
    """RankTrace's pg_status and comm_lib_version from a dump's `pg_status` and NCCL version."""
    return read_pg_status(raw), str(lib_version) if lib_version else None


def read_pg_status(raw: object) -> dict[str, tuple[int | None, int | None, int | None]] | None:
    """A dump's `pg_status` {pg_id: {last_enqueued_collective, last_started_collective, last_completed_collective}}
    (ints in pickles, strings in JSON; -1: none yet, and for `started` timing off; absent: unknown) as
    RankTrace.pg_status; None when unreadable (the frontiers then come from the entries)."""
    if not isinstance(raw, dict):
        return None
    out = {}
    for pg_id, st in raw.items():
        if not isinstance(st, dict):
            return None
        try:
            values = tuple(None if st.get(k) in (None, "") else int(st[k]) for k in _STATUS_KEYS)
        except (TypeError, ValueError, OverflowError):
            return None
        enq, started, done = values  # -1: none enqueued / completed yet, or (started) timing off
        out[str(pg_id)] = (None if enq is None else max(enq, 0), None if started is None or started < 0 else started,
                           None if done is None else max(done, 0))
    return out


ASYNC_PREFIXES = ("nccl:", "xccl:")


@dataclass(slots=True)
class Frontier:
    """One rank on one group: the last collective its CPU enqueued, the last its GPU started (None: unknown, e.g.
    timing off) and the last it completed, by the group's sequence number (collectives; p2p-only groups count
    their sends and receives instead, `space` "p2p", and such counts differ between members by design).
    `source`: "pg_status" (the dump's own record) or "entries" (derived from the entries' states). `space` says
    what the rank's entries on the group show it counts."""
    enqueued: int | None
    started: int | None
    completed: int | None
    space: str = "collective"  # "collective" | "p2p" | "mixed" | "unknown" (no entry on the group says which)
    source: str = "entries"

    @property
    def ran_ahead(self) -> bool:
        """The CPU enqueued work its GPU has not completed."""
        return self.enqueued is not None and self.completed is not None and self.enqueued > self.completed


def enqueued_collectives(f: Frontier | None) -> int | None:
    """The last collective the rank's own communicator enqueued on the group, C++'s calls included, as the
    dump's own record (`pg_status`) says it; None where the frontier is not that record or counts sends and
    receives only."""
    if f is None or f.source != "pg_status" or f.space == "p2p":
        return None
    return f.enqueued


def is_async(trace: RankTrace) -> bool:
    """The rank's backend returns before the GPU is done (NCCL, XCCL): its entries' order across groups is the
    CPU's only. Told by the dump's library version or its ops' prefixes."""
    if trace.comm_lib_version:
        return True
    if not len(trace.entries):
        return False
    # The first entry's raw name: a list of entries is read by item (building its column would cost a pass per
    # call), a column store by its column (built once and kept).
    first = trace.entries[0].raw_op if isinstance(trace.entries, list) else trace.column("raw_op")[0]
    return str(first).startswith(ASYNC_PREFIXES)


def gpu_stream(trace: RankTrace, e: Entry) -> str | None:
    """The stream the GPU executes `e` on: one per process group under NCCL; the calling stream/thread otherwise."""
    return f"group {e.group}" if is_async(trace) else e.stream


def _pg_names(trace: RankTrace, last: dict[str, tuple]) -> dict[str, str]:
    """The dump's local pg_id -> group name. Where the dump says it (`pg_names`, from NCCL's own entries) that
    holds; for the rest, PyTorch numbers a rank's groups in creation order (pg_id) and names them by a world-wide
    counter of creations, so the two orders agree: the i-th pg_id by number is the i-th name by number. Trusted
    only when the counts agree, the stated names agree with it, and every group holding entries confirms it (its
    last entry is the group's last enqueued collective); the stated names alone otherwise."""
    status = trace.pg_status or {}
    stated = {k: n for k, n in (trace.pg_names or {}).items() if k in status}
    if len(stated) == len(status):
        return stated
    names = [n for n in trace.groups if not trace.groups[n].inferred]
    if len(names) != len(status) or not all(n.isdigit() for n in names) or \
            not all(str(k).lstrip("-").isdigit() for k in status):
        return stated
    mapping = dict(zip(sorted(status, key=int), sorted(names, key=int)))
    if any(mapping[k] != n for k, n in stated.items()):
        return stated
    for pg_id, name in mapping.items():
        got = last.get(name)
        if got is not None and status[pg_id][0] not in got:
            return stated
    return mapping


def _last_issued(trace: RankTrace) -> dict[str, tuple[int | None, int | None]]:
    """group -> (its last collective seq, its last p2p seq) among the rank's entries: from the summary and the
    sends and receives alone (a big or streamed trace is not walked entry by entry)."""
    s = summarize(trace)
    out: dict[str, list] = {g: [max(index) if index else None, None] for g, index in s.by_group.items()}
    for i in s.p2p:
        e = trace.entries[i]
        if e.p2p_seq is not None:
            cur = out.setdefault(e.group, [None, None])
            cur[1] = e.p2p_seq if cur[1] is None else max(cur[1], e.p2p_seq)
    return {g: tuple(v) for g, v in out.items()}


def frontiers(trace: RankTrace) -> dict[str, Frontier]:
    """group name -> where the rank stands on it. From `pg_status` where the dump has it and its groups can be
    named (see _pg_names), else from the entries' states; a blocking backend's CPU frontier is its GPU frontier."""
    last = _last_issued(trace)
    out: dict[str, Frontier] = {}
    mapping = _pg_names(trace, last) if trace.pg_status else {}
    for pg_id, name in mapping.items():
        enq, started, done = trace.pg_status[pg_id]
        seq, p2p = last.get(name, (None, None))
        space = ("unknown" if seq is None else "collective") if p2p is None else \
            "p2p" if seq is None and enq == p2p else "mixed"
        out[name] = Frontier(enq, started if started is not None and started >= 0 else None, done, space, "pg_status")
    if not mapping:
        out.update(_entry_frontiers(trace))
    return out


def _entry_frontiers(trace: RankTrace) -> dict[str, Frontier]:
    """Frontiers from the entries alone: enqueued = the last issued; completed = the last marked completed (all
    of them on a blocking backend, whose call returned only when done, except one still in its call)."""
    out: dict[str, Frontier] = {}
    blocking = not is_async(trace)
    for g, seq, p2p, state in zip(trace.column("group"), trace.column("seq"), trace.column("p2p_seq"),
                                  trace.column("state")):
        if seq is None or p2p is not None:
            continue
        f = out.get(g) or out.setdefault(g, Frontier(None, None, None))
        f.enqueued = seq if f.enqueued is None else max(f.enqueued, seq)
        if state == "completed":
            f.completed = seq if f.completed is None else max(f.completed, seq)
        if state in ("started", "completed"):
            f.started = seq if f.started is None else max(f.started, seq)
    if blocking:
        for f in out.values():
            f.started = f.enqueued
    return out
