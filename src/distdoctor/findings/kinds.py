"""The fixed vocabulary of findings and what `ranks` means for each (the JSON contract of `diagnose`, and of
`sim --format json`'s `findings`: the simulator reports in the same kinds).

- stream_deadlock: a cycle of waits through the streams of ranks that passes through an event or a buffer slot
  (or through two streams of one rank): `ranks` the ranks of the streams on the cycle; `evidence.cycle` the
  streams and what each waits on. A cycle through collectives only reads order_deadlock, through p2p only
  p2p_deadlock.
- stream_starved: a stream waits on an event no stream will record, or on a buffer slot none will release;
  `ranks` that stream's rank.
- gpu_stopped: NCCL's frontiers (diagnose/nccl_frontier.py): a rank's GPU completed less than a peer's on a group
  they share while its CPU enqueued beyond it; `ranks` every such rank, `group` the group where they lag most,
  `groups` all those where they lag, `evidence.frontiers` each member's enqueued/started/completed there.
- cpu_stopped: NCCL's frontiers: a rank's GPU did all its CPU enqueued while its peers enqueued further and wait
  for its next collective; `ranks` every such rank (the CPU stopped or went elsewhere).
- crossed_p2p: a send paired with a receive meant for another message (ops pair in posting order, so the
  receiver silently gets the wrong tensor); `ranks` the sender and the receiver.

- type_mismatch, size_mismatch, dtype_mismatch, root_mismatch: members issued different collectives at the same
  sequence number; `ranks` are the culprits, the minority.
- missing_ranks: some members never issued the collective; `ranks` are the absent ones.
- state_mismatch: some members completed the collective while others are still in it; `ranks` are the stuck ones.
- missing_dump: a member rank has no trace at all; `ranks` are those ranks.
- order_deadlock: a cycle of waits across process groups; `ranks` all ranks on the cycle, `groups` the groups.
- p2p_deadlock: send/recv that can never match; `ranks` the ranks involved, ascending, except that the rank the
  evidence shows deviating (it posted fewer matching calls and went on; `evidence.deviating`) comes first. Where
  it cannot tell (a send/recv pair that disagrees on sizes) they stay ascending and the detail says "one of ranks".
- crashed: a rank died of an exception (the recorder's dump says which, and where); `ranks` the ranks that crashed
  first (ranks that failed later inside a collective, waiting for them, are consequences).
- stuck_collective: ranks are blocked in a collective that nothing visible holds up: every member reached it (the
  transport or a device hangs, or the dump caught it in flight), or no other member is known to exist (a group no
  other rank's trace shows); `ranks` the ranks still in it.
- straggler: no hang, but a rank arrives late at collectives consistently; `ranks` the late ones.
- stuck_thread: from per-rank logs, a thread began an op and never finished it, or (`evidence.why` idle_behind) began
  nothing after finishing fewer runs of an op than its peers (diagnose/threads.py); `ranks` the ranks whose thread is
  stuck, `op` the op (the log's name for it), `evidence.why` how the thread differs from its peers.

The verdict is `ok` only when there is no finding. Every rank blocked in a collective or p2p at dump time, and
every rank that crashed, is named in a finding's `ranks` or in a consequence whose `finding` is the index of the
finding that explains it (diagnose/explain.py makes sure of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

KINDS = ("stream_deadlock", "gpu_stopped", "cpu_stopped", "order_deadlock", "p2p_deadlock", "stream_starved", "type_mismatch", "size_mismatch",
         "dtype_mismatch", "root_mismatch", "crashed", "missing_dump", "missing_ranks", "stuck_collective",
         "state_mismatch", "stuck_thread", "crossed_p2p", "straggler")
# Latent hazards `distdoctor lint` reports of a run that did not hang (lint/hazard.py): rendered as findings.
HAZARD_KINDS = ("order_inversion", "rank_conditional_collective", "p2p_order", "group_creation_order", "false_wait")
KINDS += HAZARD_KINDS

# Root cause first: a cycle or an impossible p2p explains every wait it causes; a mismatch explains the
# crash or hang that follows it; a crashed or lost rank explains the survivors' waits; state differences come last.
PRIORITY = {kind: i for i, kind in enumerate(KINDS)}
# Kinds whose producer lists them strongest first (threads.py: a thread inside an op its peers finished before
# one that only these ranks run): sorting keeps that order rather than ordering them by rank.
PRODUCER_ORDERED = frozenset({"stuck_thread"})


@dataclass
class Finding:
    kind: str
    ranks: list[int]
    group: str | None = None
    groups: list[str] = field(default_factory=list)
    seq: int | None = None
    op: str | None = None
    detail: str = ""
    evidence: dict = field(default_factory=dict)
    t: float | None = None  # when the evidence happened (earliest entry time), for ordering

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        self.ranks = sorted(set(self.ranks))  # a producer that knows better reorders them after (p2p.py)
        if self.group is not None and not self.groups:
            self.groups = [self.group]

    def to_json(self) -> dict:
        return {"kind": self.kind, "ranks": self.ranks, "group": self.group, "groups": self.groups,
                "seq": self.seq, "op": self.op, "detail": self.detail, "evidence": self.evidence}


def numbered(op: str, seq) -> str:
    """A call with its number in its group's order: 'all_reduce #4', or 'all_reduce (its number unknown)' where
    no trace fixes it (a recorder-only rank's call among Flight Recorder ranks', loaders/align_ranks.py)."""
    return f"{op} #{seq}" if seq is not None else f"{op} (its number unknown)"


def nth(n: int) -> str:
    """An ordinal in words: '1st', '2nd', '11th'."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def fmt_ranks(ranks) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    if len(ranks) > 8:
        return "ranks " + ", ".join(map(str, ranks[:8])) + f", ... ({len(ranks)} ranks)"
    return "ranks " + ", ".join(map(str, ranks))


# Descriptions that say nothing about what the user called a group.
_NO_DESC = ("", "undefined", "default_pg")


def group_desc(desc: str | None) -> str:
    """What the user called a group (a DeviceMesh dimension's `mesh_dp`, `new_group(group_desc=...)`), or ''."""
    return "" if desc is None or desc in _NO_DESC else desc


def fmt_group(name: str | None, desc: str | None = None) -> str:
    if name is None:
        return "an unknown group"
    if name == "0":
        return "the default group '0'"
    label = group_desc(desc)
    return f"group '{name}' ({label})" if label else f"group '{name}'"
