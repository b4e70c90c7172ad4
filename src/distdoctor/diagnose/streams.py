"""Where each stream stands, when the traces say it (the simulator's do: trace/model.py `StreamState`): the one
wait-for graph over (rank, stream) and its findings (distdoctor/findings), exactly as `sim` builds them from its
program. The graph of ranks the other analyses infer from calls alone cannot see an event or a buffer slot; a
deadlock through them reads there as ranks missing from the next call. Here it reads as the cycle it is."""

from __future__ import annotations

from distdoctor.findings.kinds import Finding
from distdoctor.findings.sentences import stream_findings
from distdoctor.findings.waitfor import Node, analyze_streams
from distdoctor.trace.model import StreamState, TraceSet


def stream_states(ts: TraceSet) -> dict[Node, StreamState]:
    """(rank, stream) -> state, rank by rank, each rank's streams in the trace's order; {} without stream state."""
    return {(r, s): st for r in sorted(ts.ranks) for s, st in (ts.ranks[r].streams or {}).items()}


def analyze(ts: TraceSet) -> tuple[list[Finding], set[int]]:
    """The findings of the graph of streams, and the ranks with a blocked stream (the graph accounts for them)."""
    states = stream_states(ts)
    blocked = {n[0] for n, st in states.items() if st.waiting is not None}
    if not blocked:
        return [], set()
    g = analyze_streams(states)
    return stream_findings(states, g.edges, g.starved, g.cycle, g.more_cycles), blocked
