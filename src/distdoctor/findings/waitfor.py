"""The one wait-for graph: who waits for whom, its cycles, and the sentence an engineer writes about them.

Nodes are (rank, stream); a rank whose trace tells nothing of its streams is one node (rank, None). Edges are
typed by what they wait on (`collective`, `p2p`, `event`, `buffer`) and name that resource ("buffer act",
"collective tp0 #3", "comm_init pp_0_1", "p2p 0->2"). The simulator builds the graph from its exact program and
the doctor from traces, through one of two doors:
- `stream_graph(states)`: from where each stream stands (trace/model.py `StreamState`: the op it is blocked at,
  what it waits on, the ops still ahead on it). A blocked stream has an edge to every stream holding an op
  ahead that could free it: a `record` of the event it waits for (same rank), a `release` of the buffer it
  needs (same rank), the collective a member that has not arrived would issue as the awaited one, the matching
  send or recv on the p2p channel. A blocked stream with no such edge is starved: nothing ahead can free it.
  The simulator's engine state and the traces it emits give the same states, hence the same graph.
- `Edge`s the doctor infers between ranks from traces without stream state (diagnose/waitfor.py).
`find_cycle` is the one deterministic cycle finder (depth-first from the lowest node, out-edges in node order,
the cycle rotated to start at its lowest node); `strong_cycles` gives one such cycle per strongly connected
component; `describe_cycle` the one sentence for either kind of node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from distdoctor.trace.model import Site, StreamState

Node = tuple  # (rank, stream name or None)
# What a waiting kind needs ahead on another stream: the site kind that frees it.
PROVIDER = {"event": "record", "buffer": "release", "collective": "collective", "comm_init": "comm_init",
            "send": "recv", "recv": "send"}
EDGE_KIND = {"event": "event", "buffer": "buffer", "collective": "collective", "comm_init": "collective",
             "send": "p2p", "recv": "p2p"}


@dataclass
class Edge:
    src: Node
    dst: Node  # the node whose progress would free src
    kind: str  # collective | p2p | event | buffer
    resource: str  # what src waits on: "event fwd_done0", "buffer act", "collective tp0 #3", "p2p 0->2"
    peer_rank: int  # the rank whose progress would free src
    dst_op: int | None = None  # stream graphs: index of the op on dst that would free src
    dst_label: str = ""  # and its label
    after: str | None = None  # the last named compute dst runs before that op
    group: str | None = None  # collective and p2p waits: the group
    op: str | None = None  # the op src waits in
    seq: int | None = None  # its number on the group (collectives) or channel (p2p)
    peer: int | None = None  # p2p: src's peer
    why: object = field(default=None, repr=False, compare=False)  # the evidence (diagnose: its Wait)


@dataclass
class Cycle:
    nodes: list[Node]  # every node of the strongly connected component
    path: list[Edge]  # one concrete cycle, starting at its lowest node
    groups: list[str] = field(default_factory=list)  # every group a wait in the component is in
    p2p_only: bool = False  # every wait in the component is a send or recv

    @property
    def ranks(self) -> list[int]:
        return sorted({n[0] for n in self.nodes})

    @property
    def steps(self) -> list[tuple[int, int, object]]:
        """The cycle rank by rank: (rank, the rank it waits for, the evidence of the wait)."""
        return [(e.src[0], e.dst[0], e.why) for e in self.path]


def _default_order(node: Node) -> tuple:
    return node[0], node[1] or ""


def find_cycle(edges: dict[Node, list[Edge]], order: Callable[[Node], object] = _default_order,
               within: set | None = None) -> list[Edge]:
    """The first cycle met by depth-first search from the lowest node (out-edges as listed), as its edges,
    rotated to start at its lowest node; [] when there is none. `within`: only these nodes."""
    color: dict[Node, int] = {}  # 1 on the stack, 2 done
    for root in sorted(edges if within is None else within, key=order):
        if color.get(root):
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
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
            if within is not None and e.dst not in within:
                continue
            if color.get(e.dst) == 1:
                start = next(j for j, pe in enumerate(path + [e]) if pe.src == e.dst)
                cycle = (path + [e])[start:]
                low = min(range(len(cycle)), key=lambda j: order(cycle[j].src))
                return cycle[low:] + cycle[:low]
            if e.dst in edges and not color.get(e.dst):
                color[e.dst] = 1
                path.append(e)
                stack.append((e.dst, 0))
    return []


def strong_cycles(edges: dict[Node, list[Edge]], order: Callable[[Node], object] = _default_order) -> list[Cycle]:
    """One cycle per strongly connected component that has one, components in node order."""
    import networkx as nx  # here: importing it costs about half a second, and most hangs have no cycle

    g = nx.DiGraph()
    for src, out in edges.items():
        for e in out:
            g.add_edge(src, e.dst)
    cycles = []
    for comp in nx.strongly_connected_components(g):
        if len(comp) < 2 and not any(g.has_edge(n, n) for n in comp):
            continue
        path = find_cycle(edges, order, within=set(comp))
        inside = [e for n in comp for e in edges.get(n, []) if e.dst in comp]
        groups = sorted({e.group for e in inside if e.group is not None}, key=_group_order)
        cycles.append(Cycle(sorted(comp, key=order), path, groups, all(e.kind == "p2p" for e in inside)))
    cycles.sort(key=lambda c: [order(n) for n in c.nodes])
    return cycles


def _group_order(name: str) -> tuple:
    return not name.isdigit(), int(name) if name.isdigit() else 0, name


def other_cycles(edges: dict[Node, list[Edge]], first: list[Edge],
                 order: Callable[[Node], object] = _default_order) -> list[list[Node]]:
    """Further cycles disjoint from `first`, found in O(V) by following each blocked node's first edge (every
    walk ends in a cycle or a starved node). A plan replicated over ranks often deadlocks the same way on
    every replica: these are those repeats, not consequences of the first cycle."""
    done = {e.src for e in first}
    found = []
    for start in sorted(edges, key=order):
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


# ---- the graph of streams ----------------------------------------------------------------------------------------

@dataclass
class Starved:
    reason: str  # why nothing ahead can free the stream
    ranks: list[int]  # the ranks at fault (that never issue, never post, never record or release)


def _channel(name: str) -> tuple[int, int]:
    src, dst = name.split(" ", 1)[0].split("->")
    return int(src), int(dst)


def stream_graph(states: dict[Node, StreamState]) -> tuple[dict[Node, list[Edge]], dict[Node, Starved]]:
    """Edges of every blocked stream (`states` in node order), and the blocked streams nothing ahead can free."""
    order = {n: i for i, n in enumerate(states)}
    sites: dict[tuple, dict[Node, list[Site]]] = defaultdict(dict)  # (kind, name[, rank]) -> node -> sites
    for node, st in states.items():
        for s in st.ahead:
            key = (s.kind, s.name) if s.kind in ("send", "recv") else (s.kind, s.name, node[0])
            sites[key].setdefault(node, []).append(s)
    edges: dict[Node, list[Edge]] = {}
    starved: dict[Node, Starved] = {}
    for node, st in states.items():
        w = st.waiting
        if w is None:
            continue
        r = node[0]
        out: list[Edge] = []
        kind = EDGE_KIND[w.kind]
        common = dict(kind=kind, group=w.name if kind == "collective" else None, op=w.op, seq=w.seq)
        if w.kind in ("event", "buffer"):
            pool = sites.get((PROVIDER[w.kind], w.name, r), {})
            out = [Edge(node, d, resource=f"{w.kind} {w.name}", peer_rank=r, dst_op=ss[0].op_index,
                        dst_label=ss[0].op, after=ss[0].after, **common) for d, ss in pool.items() if d != node]
            if not out:
                verb = "records" if w.kind == "event" else "releases"
                own = pool.get(node)
                starved[node] = Starved(f"only rank {r} {node[1]} itself {verb} `{w.name}` again, at op "
                                        f"{own[0].op_index}, behind this op" if own else
                                        f"no stream of rank {r} {verb} `{w.name}` any more", [r])
        elif kind == "collective":
            what = f"comm_init {w.name}" if w.kind == "comm_init" else f"collective {w.name} #{w.seq}"
            never = []
            for m in w.ranks:
                pool = sites.get((PROVIDER[w.kind], w.name, m), {})
                if not pool:
                    never.append(m)
                    continue
                for d, ss in sorted(pool.items(), key=lambda x: order[x[0]]):
                    # one stream issues on the group: the site that would be the awaited number; several: the next
                    s = ss[min((w.seq or 1) - (ss[0].seq or 1), len(ss) - 1)] if len(pool) == 1 else ss[0]
                    out.append(Edge(node, d, resource=what, peer_rank=m, dst_op=s.op_index, dst_label=s.op,
                                    after=s.after, **common))
            if never:
                many = len(never) > 1
                who = f"rank{'s' if many else ''} {', '.join(map(str, never))}"
                starved[node] = Starved(
                    f"{who} never create{'' if many else 's'} communicator `{w.name}`" if w.kind == "comm_init" else
                    f"{who} never issue{'' if many else 's'} collective #{w.seq} on `{w.name}` (no more "
                    f"collectives on it)", never)
        else:
            peer = w.ranks[0]
            pool = sites.get((PROVIDER[w.kind], w.name), {})
            common.update(group=None, peer=peer)
            out = [Edge(node, d, resource=f"p2p {w.name}", peer_rank=peer, dst_op=ss[0].op_index,
                        dst_label=ss[0].op, after=ss[0].after, **common) for d, ss in pool.items()]
            if not out:
                starved[node] = Starved(f"rank {peer} posts no matching {PROVIDER[w.kind]} any more", [peer])
        edges[node] = sorted(out, key=lambda e: (order[e.dst], e.dst_op))
    return edges, starved


def stream_order(states: dict[Node, StreamState]) -> Callable[[Node], int]:
    """Node order of a stream graph: the order of `states` (rank by rank, each rank's streams as declared)."""
    index = {n: i for i, n in enumerate(states)}
    return index.__getitem__


@dataclass
class StreamGraph:
    """A graph of streams and what it holds: the first cycle, the disjoint ones, the streams nothing can free."""
    states: dict[Node, StreamState]
    edges: dict[Node, list[Edge]]
    starved: dict[Node, Starved]
    cycle: list[Edge]
    more_cycles: list[list[Node]]


def analyze_streams(states: dict[Node, StreamState]) -> StreamGraph:
    """The one analysis of a graph of streams, whoever built the states (the simulator, a trace's stream state)."""
    edges, starved = stream_graph(states)
    order = stream_order(states)
    cycle = find_cycle(edges, order)
    return StreamGraph(states, edges, starved, cycle, other_cycles(edges, cycle, order))
