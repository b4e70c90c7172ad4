"""What a wait-for graph means, in the sentence an engineer writes and in findings: one builder for a cycle of
streams and for a cycle of ranks, and the findings of a graph of streams (the simulator's and the doctor's of
the traces the simulator emits read alike, because both come from here)."""

from __future__ import annotations

from collections import deque

from distdoctor.findings.kinds import Finding, fmt_ranks, numbered
from distdoctor.findings.waitfor import Edge, Node, Starved
from distdoctor.trace.model import StreamState

MAX_CYCLE_FINDINGS = 100  # a plan replicated over thousands of ranks repeats its cycle on every replica


def _who(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _need(st: StreamState, e: Edge) -> str:
    w = st.waiting
    if w.kind == "event":
        return f"waits for event `{w.name}`"
    if w.kind == "buffer":
        return f"waits for a free `{w.name}` slot"
    if w.kind == "comm_init":
        return f"waits in comm_init of `{w.name}` for {_who(w.ranks)} to create it too"
    if w.kind == "collective":
        return f"waits in {w.op} #{w.seq} on `{w.name}` for {_who(w.ranks)}"
    return f"waits to send to rank {e.peer_rank}" if w.kind == "send" else f"waits to receive from rank {e.peer_rank}"


def _provider(st: StreamState, e: Edge) -> str:
    r, s = e.dst
    where = f"at op {e.dst_op} (`{e.dst_label}`" + (f", after `{e.after}`)" if e.after else ")")
    verb = {"event": f"recorded only by rank {r} {s}", "buffer": f"released only by rank {r} {s}",
            "collective": f"which rank {r} {s} issues only", "comm_init": f"which rank {r} {s} calls only",
            "send": f"whose {s} posts the matching recv only", "recv": f"whose {s} sends only"}[st.waiting.kind]
    return f"{verb} {where}"


def _stream_sentence(states: dict[Node, StreamState], cycle: list[Edge]) -> str:
    first = cycle[0]
    st = states[first.src]
    r, s = first.src
    parts = [f"rank {r} {s} {_need(st, first)} (op {st.op_index} `{st.op}`), {_provider(st, first)}"]
    for e in cycle[1:]:
        st = states[e.src]
        parts.append(f", which is stuck before that at op {st.op_index} (`{st.op}`) and {_need(st, e)}, "
                     f"{_provider(st, e)}")
    parts.append(f", which is stuck before that at op {states[first.src].op_index}: the cycle closes, no stream on "
                 f"it can move.")
    return "".join(parts)


def _rank_wait(e: Edge) -> str:
    if e.kind == "p2p":
        return (f"rank {e.src[0]} waits in {e.op} {'to' if e.op == 'send' else 'from'} rank {e.peer} (group "
                f"'{e.group}') for rank {e.dst[0]}")
    return f"rank {e.src[0]} waits in group '{e.group}' {numbered(e.op, e.seq)} for rank {e.dst[0]}"


def describe_cycle(cycle: list[Edge], states: dict[Node, StreamState] | None = None) -> str:
    """The cycle in words: stream by stream, what each waits for and where the op that would free it stands
    (a graph of streams), or rank by rank, in which call each waits for which rank (a graph of ranks)."""
    if states is not None and all(e.src in states for e in cycle):
        return _stream_sentence(states, cycle)
    return " -> ".join(_rank_wait(e) for e in cycle) + f" -> (back to rank {cycle[0].src[0]})"


def starvation_sentence(node: Node, st: StreamState, why: Starved) -> str:
    w = st.waiting
    need = {"comm_init": f"waits in comm_init of `{w.name}`", "collective": f"waits in {w.op} #{w.seq} on `{w.name}`",
            "event": f"waits for event `{w.name}`", "buffer": f"waits for a free `{w.name}` slot",
            "send": f"waits to send to rank {w.ranks[0] if w.ranks else '?'}",
            "recv": f"waits to receive from rank {w.ranks[0] if w.ranks else '?'}"}[w.kind]
    return f"rank {node[0]} {node[1]} {need} (op {st.op_index} `{st.op}`), but {why.reason}."


def component_of(edges: dict[Node, list[Edge]], node: Node) -> set[Node]:
    """The strongly connected component holding `node`: reachable from it and reaching it (linear time)."""
    def reach(start: Node, nexts) -> set[Node]:
        seen, todo = {start}, deque([start])
        while todo:
            for n in nexts(todo.popleft()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    back: dict[Node, list[Node]] = {}
    for src, out in edges.items():
        for e in out:
            back.setdefault(e.dst, []).append(src)
    return reach(node, lambda n: [e.dst for e in edges.get(n, [])]) & reach(node, lambda n: back.get(n, []))


def _cycle_kind(cycle: list[Edge]) -> str:
    kinds = {e.kind for e in cycle}
    if kinds & {"event", "buffer"} or len({e.src[0] for e in cycle}) < len(cycle):
        return "stream_deadlock"  # through an event or a slot, or through two streams of one rank
    return "p2p_deadlock" if kinds == {"p2p"} else "order_deadlock"


def _where(node: Node, st: StreamState) -> dict:
    return {"rank": node[0], "stream": node[1], "op_index": st.op_index, "op": st.op}


def cycle_finding(states: dict[Node, StreamState], edges: dict[Node, list[Edge]], cycle: list[Edge]) -> Finding:
    comp = component_of(edges, cycle[0].src)
    inside = [e for n in comp for e in edges.get(n, []) if e.dst in comp]
    groups = sorted({e.group for e in inside if e.group is not None})
    first = cycle[0]
    return Finding(_cycle_kind(cycle), [n[0] for n in comp], group=first.group, groups=groups,
                   seq=first.seq, op=first.op, detail=describe_cycle(cycle, states),
                   evidence={"cycle": [dict(_where(e.src, states[e.src]), waits_on=e.resource,
                                            waits_for={"rank": e.dst[0], "stream": e.dst[1], "op_index": e.dst_op,
                                                       "op": e.dst_label}) for e in cycle]})


def stream_findings(states: dict[Node, StreamState], edges: dict[Node, list[Edge]], starved: dict[Node, Starved],
                    cycle: list[Edge], more: list[list[Node]] = ()) -> list[Finding]:
    """The findings of a graph of streams: its first cycle, then the cycles disjoint from it (a replicated plan
    deadlocks alike on every replica; at most MAX_CYCLE_FINDINGS), then the streams nothing can free (one finding
    per kind, culprits and collective: the first stream's sentence, the count of the others)."""
    out = []
    if cycle:
        out.append(cycle_finding(states, edges, cycle))
        for nodes in more[:MAX_CYCLE_FINDINGS]:
            out.append(cycle_finding(states, edges, [edges[n][0] for n in nodes]))  # the walk that found it
    grouped: dict[tuple, list[Node]] = {}
    for node, why in starved.items():
        w = states[node].waiting
        kind = "stream_starved" if w.kind in ("event", "buffer") else "missing_ranks"
        key = (kind, tuple(why.ranks), w.name if kind == "missing_ranks" else None, w.seq, w.op)
        grouped.setdefault(key, []).append(node)
    for (kind, ranks, group, seq, op), nodes in grouped.items():
        detail = starvation_sentence(nodes[0], states[nodes[0]], starved[nodes[0]])
        if len(nodes) > 1:
            detail += f" {len(nodes) - 1} more stream(s) wait on the same ({fmt_ranks({n[0] for n in nodes})})."
        if kind == "missing_ranks" and states[nodes[0]].waiting.kind in ("send", "recv"):
            group = None  # a p2p channel, not a group
        out.append(Finding(kind, list(ranks), group=group, seq=seq, op=op, detail=detail,
                           evidence={"blocked_streams": [_where(n, states[n]) for n in nodes[:100]],
                                     "blocked_streams_count": len(nodes)}))
    return out
