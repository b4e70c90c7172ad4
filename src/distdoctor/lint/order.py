"""order_inversion: ranks issue collectives of different groups in orders that no single global order explains.

Every collective is a node (group, sequence number); each rank's issue order adds an edge from each of its
collectives to its next one. With blocking collectives a job completes only if these edges admit one global
order (each collective needs every member): a cycle is a deadlock waiting for blocking calls, NCCL's one stream
per device, or a different timing. A run that completed with a cycle got through because the calls were async
(issued, then waited) or the backend ran each group on its own thread (Gloo). The check is a topological sort of
the union (Kahn); only the nodes left on cycles are then looked at closely (their strongly connected components),
each giving one hazard with its witness: two ranks that issued the same two collectives in opposite orders, else
the cycle itself through several groups (as in a DeviceMesh ring: 0 -> 1 -> 3 -> 2 -> 0).
"""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from distdoctor.findings.kinds import fmt_group, fmt_ranks
from distdoctor.lint.hazard import Hazard, call, site_of
from distdoctor.trace.frontier import is_async
from distdoctor.trace.model import RankTrace, TraceSet
from distdoctor.trace.summary import summarize


def group_key(trace: RankTrace, name: str) -> tuple:
    """A group across ranks: its name, and its members where the dump states them (two groups made by one
    split can share a name on different ranks; inferred members say nothing new)."""
    g = trace.groups.get(name)
    return (name, tuple(g.ranks)) if g is not None and not g.inferred and g.ranks else (name, None)


class _Nodes:
    """(group key, seq) <-> dense integer ids, per group a contiguous block."""

    def __init__(self, ts: TraceSet):
        lo: dict[tuple, int] = {}
        hi: dict[tuple, int] = {}
        for trace in ts.ranks.values():
            for name, seqs in summarize(trace).by_group.items():
                if not seqs:
                    continue
                k = group_key(trace, name)
                a, b = min(seqs), max(seqs)
                lo[k] = min(lo.get(k, a), a)
                hi[k] = max(hi.get(k, b), b)
        self.base: dict[tuple, int] = {}
        self.keys: list[tuple] = []
        n = 0
        for k in sorted(lo, key=repr):
            self.base[k] = n - lo[k]
            self.keys.append((n, k, lo[k]))
            n += hi[k] - lo[k] + 1
        self.n = n
        self._starts = np.array([s for s, _, _ in self.keys], dtype=np.int64)

    def key(self, node: int) -> tuple[tuple, int]:
        i = int(np.searchsorted(self._starts, node, side="right")) - 1
        start, k, lo = self.keys[i]
        return k, node - start + lo


def rank_order(trace: RankTrace, nodes: _Nodes) -> tuple[np.ndarray, np.ndarray]:
    """(node ids, entry positions) of the rank's collectives, in issue order."""
    ids, pos = [], []
    for name, seqs in summarize(trace).by_group.items():
        if not seqs:
            continue
        base = nodes.base[group_key(trace, name)]
        ids.append(np.fromiter(seqs.keys(), dtype=np.int64, count=len(seqs)) + base)
        pos.append(np.fromiter(seqs.values(), dtype=np.int64, count=len(seqs)))
    if not ids:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ids_a, pos_a = np.concatenate(ids), np.concatenate(pos)
    order = np.argsort(pos_a, kind="stable")
    return ids_a[order], pos_a[order]


def _cyclic_nodes(n: int, src: np.ndarray, dst: np.ndarray) -> set[int]:
    """Nodes on or between cycles: what Kahn's sort cannot remove from either end."""
    alive = np.ones(n, dtype=bool)
    for a, b in ((src, dst), (dst, src)):  # forwards (sources first), then backwards (sinks first)
        keep = alive[a] & alive[b]
        a, b = a[keep], b[keep]
        indeg = np.bincount(b, minlength=n)
        order = np.argsort(a, kind="stable")
        a_sorted, b_sorted = a[order], b[order]
        starts = np.searchsorted(a_sorted, np.arange(n + 1))
        succ = b_sorted.tolist()
        starts = starts.tolist()
        deg = indeg.tolist()
        queue = deque(i for i in np.flatnonzero(alive & (indeg == 0)).tolist())
        while queue:
            u = queue.popleft()
            alive[u] = False
            for v in succ[starts[u]:starts[u + 1]]:
                deg[v] -= 1
                if deg[v] == 0:
                    queue.append(v)
        if not alive.any():
            return set()
    return set(np.flatnonzero(alive).tolist())


def find(ts: TraceSet) -> list[Hazard]:
    nodes = _Nodes(ts)
    if nodes.n == 0:
        return []
    orders = {r: rank_order(t, nodes) for r, t in ts.ranks.items()}
    edges = [ids[:-1] * nodes.n + ids[1:] for ids, _ in orders.values() if len(ids) > 1]
    if not edges:
        return []
    unique = np.unique(np.concatenate(edges))
    core = _cyclic_nodes(nodes.n, unique // nodes.n, unique % nodes.n)
    if not core:
        return []
    # One hazard per way the ranks part (a loop repeats it every step: said once, with the count).
    merged: dict[tuple, Hazard] = {}
    for comp in _components(core, unique, nodes.n):
        for h in _hazards(ts, nodes, orders, comp):
            signature = (h.kind, tuple(h.ranks), tuple(h.groups), h.evidence.get("signature"))
            got = merged.get(signature)
            if got is None:
                merged[signature] = h
            else:
                got.evidence["repeats"] = got.evidence.get("repeats", 1) + 1
    for h in merged.values():
        h.evidence.pop("signature", None)
        n = h.evidence.get("repeats", 1)
        if n > 1:
            h.detail += f" The same inversion recurs {n - 1} more time(s) later in the run."
        if all(is_async(ts.ranks[r]) for r in h.ranks if r in ts.ranks):
            h.evidence["nccl"] = True
            h.detail += (" These are NCCL calls: each group runs on its own GPU stream, so the order is the CPU's; "
                         "the GPUs deadlock on it only where a rank waits for one of the two collectives (wait(), "
                         "a CPU sync, a stream wait) before it issues the other, or under blocking waits.")
    return list(merged.values())


def _components(core: set[int], unique: np.ndarray, n: int) -> list[set[int]]:
    import networkx as nx

    src, dst = unique // n, unique % n
    mask = np.isin(src, list(core)) & np.isin(dst, list(core))
    g = nx.DiGraph()
    g.add_edges_from(zip(src[mask].tolist(), dst[mask].tolist()))
    return sorted((c for c in nx.strongly_connected_components(g) if len(c) > 1), key=min)


def _hazards(ts: TraceSet, nodes: _Nodes, orders: dict, comp: set[int]) -> list[Hazard]:
    comp_arr = np.array(sorted(comp), dtype=np.int64)
    restricted = {}  # rank -> [(node, position)] of its collectives on the cycle, in issue order
    for r, (ids, pos) in sorted(orders.items()):
        keep = np.isin(ids, comp_arr)
        if keep.any():
            restricted[r] = list(zip(ids[keep].tolist(), pos[keep].tolist()))
    pairs = _inverted_pairs(restricted)
    if pairs:
        return [_pair_hazard(ts, nodes, restricted, x, y) for x, y in pairs]
    return [_cycle_hazard(ts, nodes, restricted, comp)]


WITNESS_RANKS = 64  # ranks compared pairwise for direct inversions (a thousand-rank cycle has a few patterns)
WITNESS_PAIRS = 8


def _inverted_pairs(restricted: dict) -> list[tuple[int, int]]:
    """(x, y): collectives some rank issued x before y and another y before x, both issuing both."""
    ranks = list(restricted)[:WITNESS_RANKS]
    found: dict[frozenset, tuple[int, int]] = {}
    for i, a in enumerate(ranks):
        where = {node: k for k, (node, _) in enumerate(restricted[a])}
        for b in ranks[i + 1:]:
            common = [node for node, _ in restricted[b] if node in where]
            for u, v in zip(common, common[1:]):  # b issued u before v; a the other way round?
                if where[u] > where[v] and frozenset((u, v)) not in found:
                    found[frozenset((u, v))] = (v, u)
                    if len(found) == WITNESS_PAIRS:
                        return list(found.values())
    return list(found.values())


def _verb(ranks, verb: str) -> str:
    return verb + "s" if len(set(ranks)) == 1 else verb


def _describe(nodes: _Nodes, node: int, e) -> tuple[str, str]:
    (name, _), seq = nodes.key(node)
    label = f"{e.op} #{seq}" if e is not None else f"collective #{seq}"
    return label, name


def _pair_hazard(ts: TraceSet, nodes: _Nodes, restricted: dict, x: int, y: int) -> Hazard:
    first, second, entries = [], [], {}
    for r, seq_pos in restricted.items():
        at = {node: k for k, (node, _) in enumerate(seq_pos)}
        if x in at and y in at:
            (first if at[x] < at[y] else second).append(r)
            pos = dict(seq_pos)
            entries[r] = (ts.ranks[r].entries[pos[x]], ts.ranks[r].entries[pos[y]])
    ex, ey = entries[first[0]]
    (lx, gx), (ly, gy) = _describe(nodes, x, ex), _describe(nodes, y, ey)
    desc = {g: d for t in ts.ranks.values() for g, d in ((n, i.desc) for n, i in t.groups.items())}
    async_ = any(e.async_op for pair in entries.values() for e in pair)
    how = ("the calls were issued asynchronously" if async_ else
           "the backend ran each group's collectives independently")
    detail = (f"{fmt_ranks(first)} {_verb(first, 'issue')} {lx} on {fmt_group(gx, desc.get(gx))} before {ly} on "
              f"{fmt_group(gy, desc.get(gy))}, {fmt_ranks(second)} the other way round: this run completed only "
              f"because {how}; with blocking collectives, one stream per device (NCCL) or another timing it "
              f"deadlocks.")
    h = Hazard("order_inversion", first + second, sorted({gx, gy}), detail,
               evidence={"signature": (gx, ex.op, gy, ey.op),
                         "first": {"op": ex.op, "seq": nodes.key(x)[1], "group": gx},
                         "second": {"op": ey.op, "seq": nodes.key(y)[1], "group": gy},
                         "in_order": first, "inverted": second})
    for ranks, (a, b) in ((first, (0, 1)), (second, (1, 0))):
        for r in ranks:
            ea, eb = entries[r][a], entries[r][b]
            h.add_site([r], f"called {call(ea)} on group '{ea.group}' from", site_of(ea))
            h.add_site([r], f"then {call(eb)} on group '{eb.group}' from", site_of(eb))
    return h


def _cycle_hazard(ts: TraceSet, nodes: _Nodes, restricted: dict, comp: set[int]) -> Hazard:
    """No two ranks disagree directly: name the cycle, each step by a rank whose order makes it."""
    import networkx as nx

    g = nx.DiGraph()
    made_by: dict[tuple[int, int], list[int]] = defaultdict(list)
    for r, seq_pos in restricted.items():
        for (u, _), (v, _) in zip(seq_pos, seq_pos[1:]):
            g.add_edge(u, v)
            made_by[(u, v)].append(r)
    cycle = nx.find_cycle(g, source=min(comp))
    steps, ranks, groups = [], set(), set()
    h = Hazard("order_inversion", [], [], "")
    for u, v in cycle:
        r = made_by[(u, v)][0]
        pos = dict(restricted[r])
        eu, ev = ts.ranks[r].entries[pos[u]], ts.ranks[r].entries[pos[v]]
        (lu, gu), (lv, gv) = _describe(nodes, u, eu), _describe(nodes, v, ev)
        if gu != gv:
            steps.append(f"{fmt_ranks(made_by[(u, v)])} {_verb(made_by[(u, v)], 'issue')} {lu} on group '{gu}' before {lv} on group '{gv}'")
        ranks.update(made_by[(u, v)])
        groups.update((gu, gv))
        h.add_site(made_by[(u, v)][:1], f"called {call(eu)} on group '{gu}' from", site_of(eu))
    h.ranks, h.groups = sorted(ranks), sorted(groups)
    h.detail = (f"no single order of the collectives fits every rank: {'; '.join(steps)}, which closes a cycle of "
                f"waits across {len(groups)} groups; this run completed only because the calls did not block each "
                f"other (async ops, or one thread per group in Gloo); with blocking collectives it deadlocks.")
    h.evidence = {"cycle": [{"group": nodes.key(u)[0][0], "seq": nodes.key(u)[1]} for u, _ in cycle]}
    return h
