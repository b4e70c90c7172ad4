"""What a simulated run leaves behind, in the formats real runs use: per-rank traces, timeline spans.

`to_rank_traces` writes the state at the moment the simulation ends (deadlocked or not) in the doctor's
normalized trace model (distdoctor.trace.model, source "simulated"), so `distdoctor diagnose` explains a
simulated hang with the same findings as a real one:
- one entry per collective / p2p op a stream has reached, in the order the rank issued them (simulated time);
  collectives carry their IR group and the per-group sequence number (1-based: the n-th collective the rank
  issued on that group); p2p carries its peer and `p2p_seq` (n-th on that sender -> receiver channel) and
  the group spanning all ranks (a synthesized `world` group when the plan has none);
- state `completed` when the op finished, `issued` when the stream is still waiting in it;
- sizes are the op's bytes as a uint8 shape, output shape from the collective spec's size relation;
- `stacks`: one pseudo-thread per stream whose innermost frame says where the stream stands (e.g.
  `wait event fwd_done0` at `plan.yaml:rank0/fwd` line = op index);
- `streams`: each stream's state (trace/model.py `StreamState`: the op it is at, what it waits on, the ops
  ahead of it that could free others), exactly what the simulator's own wait-for graph is built from, so that
  `diagnose` of these traces finds the same cycle through streams, events and buffers and says it in the same
  sentence (distdoctor/findings).
`to_spans` gives the Chrome/Perfetto spans (distdoctor.report.chrome_trace) of a detailed run.
"""

from __future__ import annotations

from pathlib import Path

from distdoctor.collectives import get_spec
from distdoctor.report.chrome_trace import Span
from distdoctor.sim.engine import _INST, ACQUIRE, COLLECTIVE, RECV, SEND, WAIT
from distdoctor.sim.ir import label
from distdoctor.sim.result import SimResult
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, StreamState, dumps


def _where_now(res: SimResult, sid: int) -> str:
    rs = res.state
    c = rs.compiled
    p = rs.pc[sid]
    if p >= len(c.ops[sid]):
        return "finished"
    op = res.program.ranks[c.streams[sid][0]].streams[c.streams[sid][1]][p]
    code = c.ops[sid][p][0]
    if code == WAIT:
        return f"wait event {op.event}"
    if code == ACQUIRE:
        return f"acquire buffer {op.buffer}"
    if code == COLLECTIVE:
        g, k = divmod(rs.inst_of[sid], _INST)
        arrived = {c.rank_of[m] for m in rs.open_instances[rs.inst_of[sid]][1]}
        missing = [m for m in c.group_members[g] if m not in arrived]
        if op.op == "comm_init":
            return f"comm_init of {op.group} (waiting for ranks {', '.join(map(str, missing))})"
        return f"{op.kind} on {op.group} seq {k + 1} (waiting for ranks {', '.join(map(str, missing))})"
    if code in (SEND, RECV):
        return f"{op.op} {'to' if code == SEND else 'from'} {op.peer}"
    return label(op)


def to_rank_traces(res: SimResult) -> list[RankTrace]:
    rs = res.state
    if rs.comm_log is None:
        raise ValueError("simulate(..., detail=True) is needed for traces")
    c = rs.compiled
    prog = res.program
    all_ranks = sorted(prog.ranks)
    world_size = all_ranks[-1] + 1
    world = next((g for g, m in prog.groups.items() if sorted(m) == all_ranks), None)
    p2p_group = world or "world"
    reason = "simulated deadlock" if res.deadlock else "simulation finished"
    traces = []
    by_rank: dict[int, list[int]] = {}
    for sid, (r, _) in enumerate(c.streams):
        by_rank.setdefault(r, []).append(sid)
    for r in all_ranks:
        groups = {g: GroupInfo(g, list(m), desc="simulated plan") for g, m in prog.groups.items() if r in m}
        records = []
        for sid in by_rank.get(r, []):
            s = c.streams[sid][1]
            for idx, seq, t_issue, t_start, t_end in rs.comm_log[sid]:
                records.append((t_issue, sid, idx, s, seq, t_start, t_end))
        records.sort(key=lambda x: (x[0], x[1], x[2]))
        entries = []
        for t_issue, sid, idx, s, seq, t_start, t_end in records:
            op = prog.ranks[r].streams[s][idx]
            if op.op == "comm_init":  # creating a communicator is no entry of a trace (the stacks show it)
                continue
            state = "completed" if t_end is not None else "issued"
            frames = [Frame(label(op), f"{prog.source}:rank{r}/{s}", idx)]
            common = dict(index=len(entries), raw_op=label(op), state=state, stream=s, frames=frames,
                          t_created=t_issue * 1e-6, t_started=None if t_start is None else t_start * 1e-6,
                          t_completed=None if t_end is None else t_end * 1e-6, async_op=False,
                          in_dtypes=["uint8"], out_dtypes=["uint8"])
            if op.op == "collective":
                n = len(prog.groups[op.group])
                out = get_spec(op.kind).out_numel(op.bytes, n)
                entries.append(Entry(group=op.group, op=op.kind, seq=seq, in_sizes=[[op.bytes]],
                                     out_sizes=[[out]], root=op.root,
                                     reduce_op="sum" if get_spec(op.kind).reduces else None, **common))
            else:
                if p2p_group not in groups:
                    groups[p2p_group] = GroupInfo(p2p_group, all_ranks, desc="all ranks (point-to-point)")
                entries.append(Entry(group=p2p_group, op=op.op, p2p_seq=seq, peer=op.peer, in_sizes=[[op.bytes]],
                                     out_sizes=[[op.bytes]], **common))
        stacks, streams = {}, {}
        for sid in by_rank.get(r, []):
            s = c.streams[sid][1]
            where = f"{prog.source}:rank{r}/{s}"
            stacks[s] = [Frame(f"stream {s}", where, 0), Frame(_where_now(res, sid), where, rs.pc[sid])]
            streams[s] = res.states[(r, s)] if res.states is not None else StreamState()
        traces.append(RankTrace(rank=r, source="simulated", path="", version="1", world_size=world_size,
                                groups=groups, entries=entries, stacks=stacks, dump_reason=reason,
                                dump_time=rs.makespan * 1e-6, host="simulator", pid=None, streams=streams))
    return traces


def write_rank_traces(res: SimResult, directory: str | Path) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for trace in to_rank_traces(res):
        p = out / f"rank_{trace.rank}.jsonl"
        tmp = p.with_suffix(".jsonl.tmp")
        tmp.write_text(dumps(trace))
        tmp.replace(p)
        paths.append(p)
    return paths


def picture_rows(res: SimResult, max_rows: int) -> set[int]:
    """The streams a picture shows when it cannot show all: blocked ones first, then all streams of ranks
    spread evenly over the rank range (so every pipeline stage or shard group appears)."""
    c = res.state.compiled
    if len(c.streams) <= max_rows:
        return set(range(len(c.streams)))
    by_rank: dict[int, list[int]] = {}
    for sid, r in enumerate(c.rank_of):
        by_rank.setdefault(r, []).append(sid)
    ranks = sorted(by_rank)
    fit = max(1, max_rows // max(1, round(len(c.streams) / len(ranks))))
    stride = -(-len(ranks) // fit)
    order = res.state.blocked_sids() + [sid for r in ranks[::stride] for sid in by_rank[r]]
    order += [sid for sid in range(len(c.streams))]
    chosen: list[int] = []
    for sid in order:
        if sid not in chosen:
            chosen.append(sid)
        if len(chosen) == max_rows:
            break
    return set(chosen)


def to_spans(res: SimResult, only: set[int] | None = None) -> list[Span]:
    """Spans of a detailed run, optionally only for some stream ids (a picture of a huge plan)."""
    rs = res.state
    if rs.spans is None:
        raise ValueError("simulate(..., detail=True) is needed for spans")
    c = rs.compiled
    prog = res.program
    spans = []
    for sid, start, end, idx, what in rs.spans:
        if only is not None and sid not in only:
            continue
        r, s = c.streams[sid]
        op = prog.ranks[r].streams[s][idx]
        name = label(op) if what == "busy" else f"{'BLOCKED' if what == 'blocked' else 'waiting'}: {label(op)}"
        spans.append(Span(r, s, name, start, end - start, blocked=what == "blocked",
                          args={"op_index": idx, "op": op.op, "state": what}))
    return spans
