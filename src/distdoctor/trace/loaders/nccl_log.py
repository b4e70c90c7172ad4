"""NCCL_DEBUG=INFO logs as collective traces: one entry per collective call NCCL logged, then linked across ranks.

NCCL (2.3.7 to 2.30, the same format throughout) logs each call it enqueues, with NCCL_DEBUG=INFO and
NCCL_DEBUG_SUBSYS including COLL (or ALL):
  `host:pid:tid [dev] NCCL INFO AllReduce: opCount 1a sendbuff 0x.. recvbuff 0x.. count 1024 datatype 7 op 0 root 0
   comm 0x55d0.. [nranks=4] stream 0x..`
(opCount in hex; Send/Recv put the peer in `root`), and each communicator it creates (subsystem INIT, on by default):
  `... NCCL INFO comm 0x55d0.. rank 2 nranks 4 cudaDev 2 busId 3000 - Init COMPLETE`                   (<= 2.17)
  `... NCCL INFO comm 0x.. rank 2 nranks 4 cudaDev 2 nvmlDev 2 busId 3000 commId 0x3a5c.. - Init COMPLETE` (2.18-2.20)
  `... NCCL INFO ncclCommInitRank comm 0x.. rank 2 nranks 4 ... commId 0x3a5c.. - Init COMPLETE`         (2.21 on;
   ncclCommSplit adds `parent 0x.. color 1 key 2`)
Anything may precede `host:pid:tid` on a line (a timestamp, a launcher's prefix).

The communicator pointer differs per process; the commId is the same on every member, so it names the group
(`0x3a5c..`). Before commIds were logged (<= 2.17) a communicator is named by its size and creation order on each
rank (`nranks=2#0` for the first 2-rank one), which matches across ranks when they create communicators in the same
order (new_group is collective); the ranks that share such a name are split into communicators by their rank in
it, the j-th rank of each position together (the usual contiguous tensor-parallel and strided data-parallel
layouts: `nranks=2#0/1` is the second pair). A communicator whose Init line the log does not show is named by its
size and order of first use, and split into consecutive ranks. Such groups are marked inferred. Members are
ordered by their rank in the communicator; `root` and the Send/Recv peer are translated to global ranks through it.

Sequence numbers: a collective's `seq` is its position among the collectives the rank called on the communicator
since its Init line (opCount also counts Send/Recv, which differ between ranks, and a grouped call logs several
collectives under one opCount), or the opCount when the log does not show the Init line. Send/Recv keep the opCount
as `p2p_seq`.

Completion: NCCL logs a call, never its completion. A collective counts as completed when every member logged it
(all arrived, so it can complete); otherwise it is only started, and the ranks that called it wait for the members
that did not: the same matching and wait-for analysis as Flight Recorder dumps. A send (receive) is completed when
the peer logged the matching receive (send). So a hang inside a call every member made (the transport, a device)
does not show in these lines; the markers of the threads, or a Flight Recorder dump, show it. Only the last
ENTRIES_PER_COMM calls per communicator are kept (Flight Recorder keeps 2000 by default too).
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from distdoctor.collectives import canonical_op, get_spec
from distdoctor.trace.model import Entry, GroupInfo, RankLog, RankTrace

ENTRIES_PER_COMM = 2000

_LINE = re.compile(
    r"(?P<host>[^\s:]*):(?P<pid>\d+):(?P<tid>\d+) \[\d+\] NCCL INFO (?:"
    r"(?P<name>[A-Za-z]+): opCount (?P<opcount>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) "
    r"(?:size \d+ )?datatype (?P<dtype>\d+) op (?P<redop>\d+)(?: root (?P<root>-?\d+))? comm (?P<comm>\S+) "
    r"\[nranks=(?P<nranks>\d+)\] stream (?P<stream>\S+)"
    r"|(?:\w+ )?comm (?P<icomm>\S+) rank (?P<irank>\d+) nranks (?P<inranks>\d+) "
    r".*?(?:commId (?P<cid>0x[0-9a-fA-F]+) .*?)?- Init COMPLETE)")

# ncclDataType_t -> the names Flight Recorder dumps use (c10's ScalarType names), so reports read alike.
DTYPES = {0: "Char", 1: "Byte", 2: "Int", 3: "UInt32", 4: "Long", 5: "UInt64", 6: "Half", 7: "Float", 8: "Double",
          9: "BFloat16", 10: "Float8_e4m3fn", 11: "Float8_e5m2"}


@dataclass
class NcclLog:
    entries: list[Entry] = field(default_factory=list)
    world_rank: int | None = None  # this process's rank in its largest communicator
    world_size: int | None = None
    host: str | None = None
    pid: int | None = None


def read_nccl(text: str, log: RankLog) -> NcclLog:
    """The collective calls of one rank's log, with provisional group names (the communicator's key) and ranks
    within the communicator in `root`/`peer` (link_logs translates them). Raises ValueError when the lines come
    from several processes."""
    out = NcclLog()
    comm_key: dict[str, str] = {}  # pointer -> key, as of the last Init line for it (pointers are reused)
    comms: dict[str, dict] = {}  # key -> {"comm_rank", "nranks", "key_from", "ordinal"}
    per_size: dict[int, int] = {}
    kept: dict[str, deque] = {}
    pids: set[str] = set()
    best = -1
    pos = text.find("NCCL INFO ")
    while pos >= 0:
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        end = len(text) if end < 0 else end
        line = text[start:end]
        pos = text.find("NCCL INFO ", end)
        m = _LINE.search(line)
        if m is None:
            if ": opCount " in line or "Init COMPLETE" in line:
                _skip(log, text, start)
            continue
        g = m.groupdict()
        if g["icomm"] is not None:
            nranks = int(g["inranks"])
            if g["cid"]:
                key, source = g["cid"].lower(), "commId"
            else:
                key, source = f"nranks={nranks}#{per_size.get(nranks, 0)}", "creation order"
                per_size[nranks] = per_size.get(nranks, 0) + 1
            comm_key[g["icomm"]] = key
            comms[key] = {"comm_rank": int(g["irank"]), "nranks": nranks, "key_from": source, "ordinal": 0}
            if nranks > best:
                best, out.world_rank, out.world_size = nranks, int(g["irank"]), nranks
            continue
        op = canonical_op(g["name"])
        if op is None or not g["name"].isprintable():
            _skip(log, text, start)
            continue
        pids.add(g["pid"])
        out.host, out.pid = g["host"] or None, int(g["pid"])
        key = comm_key.get(g["comm"])
        if key is None:  # the log does not show this communicator's creation
            nranks = int(g["nranks"])
            unseen = sum(1 for c in comms.values() if c["key_from"] == "first use" and c["nranks"] == nranks)
            key = comm_key[g["comm"]] = f"nranks={nranks}@{unseen}"
            comms[key] = {"comm_rank": None, "nranks": nranks, "key_from": "first use", "ordinal": None}
        info = comms[key]
        opcount = int(g["opcount"], 16)
        is_p2p = op in ("send", "recv")
        seq = None
        if not is_p2p:
            seq = opcount if info["ordinal"] is None else info["ordinal"]
            if info["ordinal"] is not None:
                info["ordinal"] += 1
        row = (start, key, op, g["name"], seq, opcount, int(g["count"]), int(g["dtype"]), int(g["root"] or 0),
               g["stream"], g["tid"])
        q = kept.get(key)
        if q is None:
            q = kept[key] = deque(maxlen=ENTRIES_PER_COMM)
        q.append(row)
    if len(pids) > 1:
        raise ValueError(f"holds the NCCL lines of {len(pids)} processes (pids {', '.join(sorted(pids)[:4])}): "
                         f"give each rank its own log")
    rows = sorted(r for q in kept.values() for r in q)
    out.entries = [_entry(i, row, comms[row[1]]["nranks"]) for i, row in enumerate(rows)]
    lines = _line_numbers(text, [q[-1][0] for q in kept.values()])
    for key, q in kept.items():
        last = q[-1]
        log.nccl_last[key] = {"call": last[3], "opCount": f"{last[5]:x}", "line": f"{log.path}:{lines[last[0]]}",
                              "comm_rank": comms[key]["comm_rank"], "nranks": comms[key]["nranks"],
                              "named_by": comms[key]["key_from"]}
    return out


def _entry(index: int, row: tuple, nranks: int) -> Entry:
    _, key, op, name, seq, opcount, count, dtype, root, stream, tid = row
    spec = get_spec(op)
    in_numel = count * nranks if op in ("reduce_scatter", "all_to_all", "scatter") else count
    out_numel = in_numel if op in ("send", "recv") else spec.out_numel(in_numel, nranks)
    dt = [DTYPES.get(dtype, f"nccl_datatype_{dtype}")]
    return Entry(index=index, group=key, op=op, seq=seq, p2p_seq=opcount if seq is None else None,
                 raw_op=f"nccl:{name}", in_sizes=[[in_numel]], out_sizes=[[out_numel]], in_dtypes=dt, out_dtypes=dt,
                 root=root if spec.rooted else None, peer=root if op in ("send", "recv") else None,
                 state="issued", stream=f"thread {tid} stream {stream}")


def _skip(log: RankLog, text: str, start: int) -> None:
    log.skipped += 1
    if len(log.skipped_at) < 5:
        log.skipped_at.append(f"{log.path}:{text.count(chr(10), 0, start) + 1}")


def _line_numbers(text: str, positions: list[int]) -> dict[int, int]:
    out, prev, count = {}, 0, 1
    for pos in sorted(positions):
        count += text.count("\n", prev, pos)
        out[pos], prev = count, pos
    return out


def _split_unnamed(logs: list[RankTrace]) -> None:
    """Communicators without a commId: split the ranks sharing a name into communicators (module docstring)."""
    holders: dict[str, dict[int, int | None]] = {}
    for t in logs:
        for key, info in t.log.nccl_last.items():
            if info["named_by"] != "commId":
                holders.setdefault(key, {})[t.rank] = info["comm_rank"]
    rename: dict[tuple[str, int], str] = {}
    for key, seen in holders.items():
        n = next(t.log.nccl_last[key]["nranks"] for t in logs if key in t.log.nccl_last)
        if len(seen) <= n:
            continue
        if all(c is not None for c in seen.values()):
            by_pos: dict[int, list[int]] = {}
            for g in sorted(seen):
                by_pos.setdefault(seen[g], []).append(g)
            for pos, ranks in by_pos.items():
                for j, g in enumerate(ranks):
                    rename[(key, g)] = f"{key}/{j}"
        else:
            for j, g in enumerate(sorted(seen)):
                rename[(key, g)] = f"{key}/{j // n}"
    if not rename:
        return
    for t in logs:
        mine = {key: rename[(key, t.rank)] for key in t.log.nccl_last if (key, t.rank) in rename}
        if not mine:
            continue
        t.log.nccl_last = {mine.get(k, k): v for k, v in t.log.nccl_last.items()}
        for e in t.entries:
            e.group = mine.get(e.group, e.group)


def link_nccl(logs: list[RankTrace]) -> None:
    """Give the NCCL entries of these log traces their groups' members, global roots and peers, and their states."""
    _split_unnamed(logs)
    members: dict[str, dict[int, int | None]] = {}  # key -> global rank -> rank in the communicator
    sizes: dict[str, int] = {}
    for t in logs:
        for key, info in t.log.nccl_last.items():
            members.setdefault(key, {})[t.rank] = info["comm_rank"]
            sizes[key] = info["nranks"]
    groups: dict[str, GroupInfo] = {}
    to_global: dict[str, dict[int, int]] = {}
    for key, seen in members.items():
        n = sizes[key]
        by_comm_rank = {c: g for g, c in seen.items() if c is not None}
        if len(by_comm_rank) == n:
            ranks, inferred = [by_comm_rank[c] for c in range(n)], not key.startswith("0x")
        elif by_comm_rank and all(c == g for c, g in by_comm_rank.items()):
            ranks, inferred = list(range(n)), True  # some members left no log; ranks match the world's
            by_comm_rank = {c: c for c in range(n)}
        else:
            ranks, inferred = sorted(seen), True
        to_global[key] = by_comm_rank
        groups[key] = GroupInfo(key, ranks, inferred, f"NCCL communicator, {n} ranks")
    issued: dict[tuple[str, int], set[int]] = {}  # (group, rank) -> seqs
    pairs: dict[tuple[str, int, int, str], int] = {}  # (group, src, dst, send|recv) -> calls
    for t in logs:
        mapping = None
        for e in t.entries:
            if mapping is None or e.group != mapping[0]:
                mapping = (e.group, to_global.get(e.group, {}))
            if e.root is not None:
                e.root = mapping[1].get(e.root)
            if e.peer is not None:
                e.peer = mapping[1].get(e.peer)
            if e.seq is not None:
                issued.setdefault((e.group, t.rank), set()).add(e.seq)
            elif e.peer is not None:
                src, dst = (t.rank, e.peer) if e.op == "send" else (e.peer, t.rank)
                k = (e.group, src, dst, e.op)
                pairs[k] = pairs.get(k, 0) + 1
        t.groups.update({key: groups[key] for key in t.log.nccl_last})
    logged = {t.rank for t in logs}
    first = {k: min(seqs) for k, seqs in issued.items()}  # a member's calls before its kept ones were all made

    def called(member: int, group: str, seq: int) -> bool:
        seqs = issued.get((group, member))
        return seqs is not None and (seq in seqs or seq < first[(group, member)])

    for t in logs:
        sent: dict[tuple, int] = {}
        for e in t.entries:
            if e.seq is not None:
                everyone = all(m in logged and called(m, e.group, e.seq) for m in groups[e.group].ranks)
                e.state = "completed" if everyone else "started"
            elif e.peer is not None:
                src, dst = (t.rank, e.peer) if e.op == "send" else (e.peer, t.rank)
                k = (e.group, src, dst, e.op)
                sent[k] = sent.get(k, 0) + 1
                other = pairs.get((e.group, src, dst, "recv" if e.op == "send" else "send"), 0)
                e.state = "completed" if other >= sent[k] else "started"
        t.summary = None  # states and groups changed since the loader summarized the trace


__all__ = ["read_nccl", "link_nccl", "ENTRIES_PER_COMM"]
