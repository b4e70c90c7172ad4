"""Where every stream of a simulated run stands, from the exact program: the input of the one wait-for graph.

`stream_states` reads the engine's end state into trace/model.py `StreamState`s, one per stream in stream-id
order (rank by rank, each rank's streams as the plan declares them): the op the stream is at, what it waits
on when blocked (an event, a buffer slot, the members that have not arrived at its collective, the peer of its
send or recv), and the ops ahead of it that could free another stream (records, releases, collectives, sends
and receives; the collective a stream is parked in is already issued and frees nobody). The graph, its cycle
and the sentences are built from those states by distdoctor/findings (waitfor.py, sentences.py), as the doctor
builds them from the same states in the traces `--emit-trace` writes (sim/emit.py).
"""

from __future__ import annotations

from distdoctor.sim.engine import (_INST, ACQUIRE, COLLECTIVE, COMPUTE, RECORD, RECV, RELEASE, SEND, WAIT,
                                   RunState)
from distdoctor.sim.ir import label
from distdoctor.trace.model import Site, StreamState, Waiting

_SITE = {RECORD: "record", RELEASE: "release", SEND: "send", RECV: "recv"}


def _channel_name(rs: RunState, chan: int) -> str:
    src, dst, tag = rs.compiled.channels[chan]
    return f"{src}->{dst}" + (f" tag {tag}" if tag else "")


def _group(rs: RunState, g: int) -> tuple[str, str]:
    """(site kind, name) of a compiled group: a communicator's creation or a collective on a group."""
    init = rs.compiled.init_of.get(g)
    return ("comm_init", init) if init else ("collective", rs.compiled.group_names[g])


def _waiting(rs: RunState, sid: int) -> Waiting:
    c = rs.compiled
    code, a = c.ops[sid][rs.pc[sid]][0], c.ops[sid][rs.pc[sid]][1]
    r = c.rank_of[sid]
    if code == WAIT:
        return Waiting("event", c.event_keys[a][1], "wait", ranks=[r])
    if code == ACQUIRE:
        return Waiting("buffer", c.buffer_keys[a][1], "acquire", ranks=[r])
    if code == COLLECTIVE:
        ik = rs.inst_of[sid]
        g, k = divmod(ik, _INST)
        arrived = {c.rank_of[m] for m in rs.open_instances[ik][1]}
        kind, name = _group(rs, g)
        op = c.program.ranks[r].streams[c.streams[sid][1]][rs.pc[sid]]
        return Waiting(kind, name, "comm_init" if kind == "comm_init" else op.kind, k + 1,
                       [m for m in c.group_members[g] if m not in arrived])
    src, dst, _ = c.channels[a]
    return Waiting("send" if code == SEND else "recv", _channel_name(rs, a), "send" if code == SEND else "recv",
                   ranks=[dst if code == SEND else src])


def _ahead(rs: RunState, sid: int) -> list[Site]:
    """The ops from the cursor on that could free another stream, each with the last named compute before it;
    a collective's number on its group counts on from what the rank has issued there."""
    c = rs.compiled
    r, s = c.streams[sid]
    prog_ops = c.program.ranks[r].streams[s]
    ops = c.ops[sid]
    pc = rs.pc[sid]
    parked = sid in rs.inst_of
    seqs: dict[int, int] = {}
    out: list[Site] = []
    after = None
    for idx in range(pc, len(ops)):
        code, a = ops[idx][0], ops[idx][1]
        if code == COMPUTE:
            after = prog_ops[idx].name or after
            continue
        if code == COLLECTIVE:
            if idx == pc and parked:  # the one it is parked in is already issued
                continue
            kind, name = _group(rs, a)
            seq = seqs.get(a) or rs.coll_count.get(r * len(c.group_names) + a, 0) + 1
            seqs[a] = seq + 1
            out.append(Site(kind, name, idx, label(prog_ops[idx]), seq, after))
        elif code in _SITE:
            if code in (SEND, RECV):
                name = _channel_name(rs, a)
            else:
                name = (c.event_keys if code == RECORD else c.buffer_keys)[a][1]
            out.append(Site(_SITE[code], name, idx, label(prog_ops[idx]), None, after))
    return out


def stream_states(rs: RunState) -> dict[tuple[int, str], StreamState]:
    """(rank, stream) -> its state, every stream in stream-id order; finished streams have no op."""
    c = rs.compiled
    out: dict[tuple[int, str], StreamState] = {}
    for sid, (r, s) in enumerate(c.streams):
        p = rs.pc[sid]
        if p >= len(c.ops[sid]):
            out[(r, s)] = StreamState()
            continue
        out[(r, s)] = StreamState(p, label(c.program.ranks[r].streams[s][p]), _waiting(rs, sid), _ahead(rs, sid))
    _unknown_when_shared(out)
    return out


def _unknown_when_shared(states: dict[tuple[int, str], StreamState]) -> None:
    """A collective's number is known only when one stream of the rank issues on its group: else None (the
    graph then takes each stream's next collective there, whatever its number)."""
    streams: dict[tuple, set] = {}
    for (r, s), st in states.items():
        for site in st.ahead:
            if site.seq is not None:
                streams.setdefault((r, site.kind, site.name), set()).add(s)
    for (r, s), st in states.items():
        for site in st.ahead:
            if site.seq is not None and len(streams[(r, site.kind, site.name)]) > 1:
                site.seq = None
