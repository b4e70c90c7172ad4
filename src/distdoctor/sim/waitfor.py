"""Wait-for graph of a deadlocked run: who waits for whom, the cycle, and the sentence an engineer writes.

Nodes are the blocked streams. A blocked stream has an edge to every stream holding a *pending* op (at or
after that stream's cursor) that could unblock it:
- wait on event E (rank r)       -> streams of rank r with a pending `record E`;
- acquire of buffer B (rank r)   -> streams of rank r with a pending `release B`;
- collective #n on group G       -> for each member rank that has not arrived at #n, its streams with a
                                    pending collective on G (the one that would be its #n);
- send / recv on a channel       -> the peer's streams with a pending matching recv / send.
Every such stream is itself blocked (the run only stops when nothing can move), so a deadlock either has a
cycle or a stream whose wait nothing pending can satisfy (starvation: a missing release, a rank that never
issues its collective). The cycle is found by depth-first search from the lowest stream id with edges in
ascending order, so the result is deterministic; it is then rotated to start at its lowest stream id.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from distdoctor.sim.engine import (ACQUIRE, COLLECTIVE, RECORD, RECV, RELEASE, SEND, WAIT, _INST, RunState)
from distdoctor.sim.ir import label


@dataclass
class Edge:
    src: int  # sid
    dst: int  # sid holding the op that would unblock src
    dst_op: int  # that op's index
    kind: str  # event | buffer | collective | comm_init | send | recv
    resource: str  # "event fwd_done0", "buffer act", "collective tp0 #3", "comm_init pp_0_1", "p2p 0->2"
    peer_rank: int


def _op(rs: RunState, sid: int, idx: int):
    r, s = rs.compiled.streams[sid]
    return rs.compiled.program.ranks[r].streams[s][idx]


def build_edges(rs: RunState) -> tuple[dict[int, list[Edge]], dict[int, str]]:
    """Edges per blocked sid, plus for starved sids (no edge at all) the reason nothing can free them."""
    c = rs.compiled
    pc = rs.pc
    blocked = rs.blocked_sids()
    # Pending sites, first per stream (what would satisfy a waiter soonest).
    records, releases = defaultdict(dict), defaultdict(dict)
    coll_sites: dict[tuple[int, int], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    sends, recvs = defaultdict(dict), defaultdict(dict)
    for sid in blocked:
        ops = c.ops[sid]
        for idx in range(pc[sid], len(ops)):
            code, a = ops[idx][0], ops[idx][1]
            if code == RECORD:
                records[a].setdefault(sid, idx)
            elif code == RELEASE:
                releases[a].setdefault(sid, idx)
            elif code == COLLECTIVE:
                if not (idx == pc[sid] and sid in rs.inst_of):  # the one it is parked in is already issued
                    coll_sites[(c.rank_of[sid], a)][sid].append(idx)
            elif code == SEND:
                sends[a].setdefault(sid, idx)
            elif code == RECV:
                recvs[a].setdefault(sid, idx)
    ng = len(c.group_names)
    edges: dict[int, list[Edge]] = {}
    starved: dict[int, str] = {}
    for sid in blocked:
        code, a = c.ops[sid][pc[sid]][0], c.ops[sid][pc[sid]][1]
        r = c.rank_of[sid]
        out: list[Edge] = []
        if code in (WAIT, ACQUIRE):
            # Sites behind the blocked op on its own stream can never run first: they do not count.
            sites = (records if code == WAIT else releases)[a]
            own = sites.get(sid)
            kind, what = ("event", c.event_keys[a][1]) if code == WAIT else ("buffer", c.buffer_keys[a][1])
            verb = "records" if code == WAIT else "releases"
            out = [Edge(sid, d, i, kind, f"{kind} {what}", r) for d, i in sites.items() if d != sid]
            if not out:
                r_, s_ = c.streams[sid]
                starved[sid] = (f"only rank {r_} {s_} itself {verb} `{what}` again, at op {own}, behind this op"
                                if own is not None else f"no stream of rank {r} {verb} `{what}` any more")
        elif code == COLLECTIVE:
            ik = rs.inst_of[sid]
            g, k = divmod(ik, _INST)
            arrived = {c.rank_of[m] for m in rs.open_instances[ik][1]}
            missing = [m for m in c.group_members[g] if m not in arrived]
            init = c.init_of.get(g)
            kind, what = ("comm_init", f"comm_init {init}") if init else \
                ("collective", f"collective {c.group_names[g]} #{k + 1}")
            never = []
            for m in missing:
                sites = coll_sites.get((m, g), {})
                if not sites:
                    never.append(m)
                    continue
                ahead = k - rs.coll_count.get(m * ng + g, 0)  # collectives m issues on g before #k
                for d, idxs in sorted(sites.items()):
                    i = idxs[min(ahead, len(idxs) - 1)] if len(sites) == 1 else idxs[0]
                    out.append(Edge(sid, d, i, kind, what, m))
            if never and init:
                starved[sid] = (f"rank{'s' if len(never) > 1 else ''} {', '.join(map(str, never))} never "
                                f"create{'' if len(never) > 1 else 's'} communicator `{init}`")
            elif never:
                starved[sid] = (f"rank{'s' if len(never) > 1 else ''} {', '.join(map(str, never))} never "
                                f"issue{'' if len(never) > 1 else 's'} collective #{k + 1} on "
                                f"`{c.group_names[g]}` (no more collectives on it)")
        else:
            src, dst, tag = c.channels[a]
            peer = dst if code == SEND else src
            pool = recvs if code == SEND else sends
            what = f"p2p {src}->{dst}" + (f" tag {tag}" if tag else "")
            out = [Edge(sid, d, i, "send" if code == SEND else "recv", what, peer) for d, i in pool[a].items()]
            if not out:
                starved[sid] = f"rank {peer} posts no matching {'recv' if code == SEND else 'send'} any more"
        edges[sid] = sorted(out, key=lambda e: (e.dst, e.dst_op))
    return edges, starved


def find_cycle(edges: dict[int, list[Edge]]) -> list[Edge]:
    """The first cycle met by DFS from the lowest sid, as its edges, rotated to start at its lowest sid."""
    color: dict[int, int] = {}  # 1 on stack, 2 done
    for root in sorted(edges):
        if color.get(root):
            continue
        stack: list[tuple[int, int]] = [(root, 0)]
        path: list[Edge] = []
        color[root] = 1
        while stack:
            node, k = stack[-1]
            out = edges.get(node, [])
            if k >= len(out):
                color[node] = 2
                stack.pop()
                if path:
                    path.pop()
                continue
            stack[-1] = (node, k + 1)
            e = out[k]
            if color.get(e.dst) == 1:
                start = next(j for j, pe in enumerate(path + [e]) if pe.src == e.dst)
                cycle = (path + [e])[start:]
                low = min(range(len(cycle)), key=lambda j: cycle[j].src)
                return cycle[low:] + cycle[:low]
            if e.dst in edges and not color.get(e.dst):
                color[e.dst] = 1
                path.append(e)
                stack.append((e.dst, 0))
    return []


def other_cycles(edges: dict[int, list[Edge]], first: list[Edge]) -> list[list[int]]:
    """Further cycles disjoint from `first`, found in O(V) by following each blocked stream's first edge
    (every walk ends in a cycle or a starved stream). A plan replicated over ranks often deadlocks the same
    way on every replica: these are those repeats, not consequences of the first cycle."""
    done = {e.src for e in first}
    found = []
    for start in sorted(edges):
        if start in done:
            continue
        path, pos = [], {}
        node = start
        while node not in done and node not in pos and edges.get(node):
            pos[node] = len(path)
            path.append(node)
            node = edges[node][0].dst
        if node in pos:  # closed a new cycle
            found.append(path[pos[node]:])
        done.update(path)
    return found


def _need(rs: RunState, e: Edge) -> str:
    name = e.resource.split(" ", 1)[1]
    if e.kind == "event":
        return f"waits for event `{name}`"
    if e.kind == "buffer":
        return f"waits for a free `{name}` slot"
    if e.kind in ("collective", "comm_init"):
        op = _op(rs, e.src, rs.pc[e.src])
        ik = rs.inst_of[e.src]
        arrived = {rs.compiled.rank_of[m] for m in rs.open_instances[ik][1]}
        missing = [m for m in rs.compiled.group_members[ik // _INST] if m not in arrived]
        who = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}"
        if e.kind == "comm_init":
            return f"waits in comm_init of `{name}` for {who} to create it too"
        g, n = name.rsplit(" ", 1)
        return f"waits in {op.kind} {n} on `{g}` for {who}"
    if e.kind == "send":
        return f"waits to send to rank {e.peer_rank}"
    return f"waits to receive from rank {e.peer_rank}"


def _provider(rs: RunState, e: Edge) -> str:
    r, s = rs.compiled.streams[e.dst]
    # Name the last compute the provider must finish first ("released only by rank 0 bwd after bwd_mb0").
    after = next((op.name for op in (_op(rs, e.dst, i) for i in range(e.dst_op - 1, rs.pc[e.dst] - 1, -1))
                  if op.op == "compute" and op.name), None)
    where = f"at op {e.dst_op} (`{label(_op(rs, e.dst, e.dst_op))}`" + (f", after `{after}`)" if after else ")")
    if e.kind == "event":
        return f"recorded only by rank {r} {s} {where}"
    if e.kind == "buffer":
        return f"released only by rank {r} {s} {where}"
    if e.kind == "collective":
        return f"which rank {r} {s} issues only {where}"
    if e.kind == "comm_init":
        return f"which rank {r} {s} calls only {where}"
    if e.kind == "send":
        return f"whose {s} posts the matching recv only {where}"
    return f"whose {s} sends only {where}"


def cycle_sentence(rs: RunState, cycle: list[Edge]) -> str:
    first = cycle[0]
    r, s = rs.compiled.streams[first.src]
    p = rs.pc[first.src]
    parts = [f"rank {r} {s} {_need(rs, first)} (op {p} `{label(_op(rs, first.src, p))}`), "
             f"{_provider(rs, first)}"]
    for e in cycle[1:]:
        p = rs.pc[e.src]
        parts.append(f", which is stuck before that at op {p} (`{label(_op(rs, e.src, p))}`) and "
                     f"{_need(rs, e)}, {_provider(rs, e)}")
    p0 = rs.pc[first.src]
    parts.append(f", which is stuck before that at op {p0}: the cycle closes, no stream on it can move.")
    return "".join(parts)


def starvation_sentence(rs: RunState, sid: int, reason: str) -> str:
    r, s = rs.compiled.streams[sid]
    p = rs.pc[sid]
    op = _op(rs, sid, p)
    code = rs.compiled.ops[sid][p][0]
    if code == COLLECTIVE and op.op == "comm_init":
        need = f"waits in comm_init of `{op.group}`"
    elif code == COLLECTIVE:
        g, k = divmod(rs.inst_of[sid], _INST)
        need = f"waits in {op.kind} #{k + 1} on `{rs.compiled.group_names[g]}`"
    elif code == WAIT:
        need = f"waits for event `{op.event}`"
    elif code == ACQUIRE:
        need = f"waits for a free `{op.buffer}` slot"
    else:
        need = f"waits to {'send to' if code == SEND else 'receive from'} rank {op.peer}"
    return f"rank {r} {s} {need} (op {p} `{label(op)}`), but {reason}."
