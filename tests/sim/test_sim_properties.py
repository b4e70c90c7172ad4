"""Property tests: programs built from a valid schedule never deadlock; dropping a release from a one-slot buffer
always does.

A valid schedule is a global sequence of steps (compute, record-then-wait, a collective of a group, a send/recv
pair, acquire/release of a stream's own buffer). Each rank issues all collectives of a group on one stream and
each p2p channel end lives on one stream, so the matching the engine does (n-th collective per group, FIFO per
channel) is the schedule's own; every op then depends only on earlier steps, so some execution finishes.
"""

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distdoctor.sim.ir import Op, Program, RankProgram, parse_text, program_to_dict
from distdoctor.sim.result import simulate

KINDS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier"]


@st.composite
def valid_programs(draw):
    n_ranks = draw(st.integers(2, 4))
    streams = {r: [f"s{i}" for i in range(draw(st.integers(1, 3)))] for r in range(n_ranks)}
    groups = {"world": list(range(n_ranks))}
    for a in range(n_ranks):
        for b in range(a + 1, n_ranks):
            if draw(st.booleans()):
                groups[f"g{a}{b}"] = [a, b]
    coll_stream = {(r, g): draw(st.sampled_from(streams[r])) for g, m in groups.items() for r in m}
    chan_stream: dict[tuple, str] = {}
    ops = {r: {s: [] for s in streams[r]} for r in range(n_ranks)}
    held = {(r, s): 0 for r in range(n_ranks) for s in streams[r]}
    n_events = 0
    us = st.floats(0, 50, allow_nan=False).map(lambda x: round(x, 2))
    for _ in range(draw(st.integers(1, 30))):
        step = draw(st.sampled_from(["compute", "event", "collective", "p2p", "acquire", "release"]))
        r = draw(st.integers(0, n_ranks - 1))
        s = draw(st.sampled_from(streams[r]))
        if step == "compute":
            ops[r][s].append(Op("compute", "c", draw(us)))
        elif step == "event":
            s2 = draw(st.sampled_from(streams[r]))
            ev = f"e{n_events}"
            n_events += 1
            ops[r][s].append(Op("record", event=ev))
            ops[r][s2].append(Op("wait", event=ev))
        elif step == "collective":
            g = draw(st.sampled_from(sorted(groups)))
            kind, dur = draw(st.sampled_from(KINDS)), draw(us)
            for m in groups[g]:
                ops[m][coll_stream[(m, g)]].append(Op("collective", g, dur, group=g, kind=kind, bytes=64))
        elif step == "p2p":
            dst = draw(st.integers(0, n_ranks - 1).filter(lambda x: x != r))
            ss = chan_stream.setdefault((r, dst, "send"), s)
            rs = chan_stream.setdefault((r, dst, "recv"), draw(st.sampled_from(streams[dst])))
            dur = draw(us)
            ops[r][ss].append(Op("send", us=dur, peer=dst, bytes=8))
            ops[dst][rs].append(Op("recv", us=dur, peer=r, bytes=8))
        elif step == "acquire" and held[(r, s)] < 2:
            held[(r, s)] += 1
            ops[r][s].append(Op("acquire", buffer=f"b_{s}"))
        elif step == "release" and held[(r, s)] > 0:
            held[(r, s)] -= 1
            ops[r][s].append(Op("release", buffer=f"b_{s}"))
    ranks = {r: RankProgram(buffers={f"b_{s}": 2 for s in streams[r]}, streams=ops[r]) for r in range(n_ranks)}
    return Program(groups=groups, ranks=ranks, source="prop.yaml")


def _round_trip(prog: Program) -> Program:
    """Through the YAML writer and the real parser, so the property covers the parser and checks too."""
    return parse_text(yaml.safe_dump(program_to_dict(prog)), prog.source)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs())
def test_program_from_a_valid_schedule_never_deadlocks(prog):
    out = simulate(_round_trip(prog)).to_json()
    assert out["deadlock"] is False, out["explanation"]
    assert out["ops_executed"] == out["ops"]
    assert out["mismatches"] == []


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_programs(), st.data())
def test_removing_a_release_from_a_one_slot_buffer_always_deadlocks(prog, data):
    r = data.draw(st.sampled_from(sorted(prog.ranks)))
    s = data.draw(st.sampled_from(sorted(prog.ranks[r].streams)))
    ops = prog.ranks[r].streams[s]
    pairs = data.draw(st.integers(2, 4))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(ops)), min_size=2 * pairs, max_size=2 * pairs)))
    new, last = [], 0
    for k, cut in enumerate(cuts):  # acquire, release, acquire, release, ... spread through the stream
        new += ops[last:cut] + [Op("acquire" if k % 2 == 0 else "release", buffer="slot")]
        last = cut
    new += ops[last:]
    prog.ranks[r].streams[s] = new
    prog.ranks[r].buffers["slot"] = 1
    assert simulate(_round_trip(prog)).to_json()["deadlock"] is False  # still a valid schedule
    releases = [i for i, op in enumerate(new) if op.op == "release" and op.buffer == "slot"]
    drop = data.draw(st.sampled_from(releases[:-1]))  # any release but the last: a later acquire starves
    prog.ranks[r].streams[s] = new[:drop] + new[drop + 1:]
    out = simulate(_round_trip(prog)).to_json()
    assert out["deadlock"] is True
    next_acquire = next(i for i, op in enumerate(new) if i > drop and op.op == "acquire" and op.buffer == "slot") - 1
    assert {"rank": r, "stream": s, "op_index": next_acquire, "op": "acquire slot"} in out["blocked"]
    assert any("`slot`" in line for line in out["explanation"])


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**12), st.floats(allow_nan=True), st.text(max_size=6))
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                       max_leaves=20)
_op_like = st.fixed_dictionaries({"op": st.sampled_from(["compute", "record", "wait", "acquire", "release",
                                                        "collective", "send", "recv", "bogus"])},
                                  optional={"us": _scalars, "event": _scalars, "buffer": _scalars, "group": _scalars,
                                            "kind": st.sampled_from(["all_reduce", "allfoo", 3]), "peer": _scalars,
                                            "bytes": _scalars, "tag": _scalars, "root": _scalars, "x": _values})


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(
    _values,
    st.fixed_dictionaries({"ranks": st.dictionaries(st.sampled_from(["0", "1", "x", "-1"]), st.fixed_dictionaries(
        {"streams": st.dictionaries(st.sampled_from(["s", "t"]), st.lists(_op_like, max_size=4), max_size=2)},
        optional={"buffers": st.dictionaries(st.sampled_from(["b", "act"]), _scalars, max_size=2)}), max_size=2)},
        optional={"groups": st.dictionaries(st.sampled_from(["g", "tp"]), st.lists(_scalars, max_size=3), max_size=2),
                  "cost": _values}),
))
def test_parser_never_raises_anything_but_input_error(raw):
    """Whatever the file holds, the parser (and a simulation of what it accepts) ends in a result or InputError."""
    from distdoctor.errors import InputError

    try:
        text = yaml.safe_dump(raw)
    except yaml.YAMLError:
        return
    try:
        prog = parse_text(text, "fuzz.yaml")
    except InputError as exc:
        assert str(exc).startswith("fuzz.yaml")
        return
    simulate(prog).to_json()
