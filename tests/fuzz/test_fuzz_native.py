"""Fuzz the native trace format parser (`distdoctor.trace.model.loads`): any damaged or mutated file gives a
RankTrace or a ValueError with a reason — never another exception."""

from __future__ import annotations

import json

from hypothesis import assume, given
from hypothesis import strategies as st

from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, dumps, loads

from fuzz_inputs import damaged_bytes, deep, json_text, mutated_structure

SEED = RankTrace(
    rank=1, source="native", world_size=4, host="host1", pid=123, dump_reason="hang", dump_time=1.7e9,
    groups={"0": GroupInfo("0", [0, 1, 2, 3]), "1": GroupInfo("1", [0, 1], inferred=True)},
    entries=[Entry(0, "0", "all_reduce", seq=1, in_sizes=[[8]], out_sizes=[[8]], in_dtypes=["float32"],
                   state="completed", t_created=1.0, frames=[Frame("train_step", "train.py", 10)]),
             Entry(1, "1", "broadcast", seq=1, root=0, state="started"),
             Entry(2, "0", "send", p2p_seq=1, peer=2, state="issued")],
    stacks={"MainThread": [Frame("all_reduce", "distributed_c10d.py", 3245)]},
)
SEED_TEXT = dumps(SEED)
SEED_LINES = [json.loads(line) for line in SEED_TEXT.splitlines()]


def _parse(text: str) -> None:
    try:
        trace = loads(text, path="rank_1.jsonl")
    except ValueError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(trace, RankTrace)


def test_seed_round_trips():
    assert loads(SEED_TEXT).entries == SEED.entries


@given(mutated_structure(SEED_LINES, allow_bytes=False))
def test_mutated_native_lines(lines):
    parts = [json_text(x) for x in lines] if isinstance(lines, list) else [json_text(lines)]
    assume(all(p is not None for p in parts))
    _parse("\n".join(parts))


@given(damaged_bytes(SEED_TEXT.encode()))
def test_damaged_native_bytes(data):
    _parse(data.decode("utf-8", errors="replace"))


@given(st.integers(1, 200_000), st.integers(0, 3))
def test_deeply_nested_native(depth, where):
    lines = SEED_TEXT.splitlines()
    nested = json.dumps(deep(min(depth, 900)))  # json.dumps itself recurses; build the deepest part by hand
    nested = "[" * max(0, depth - 900) + nested + "]" * max(0, depth - 900)
    if where == 0:
        lines[0] = nested
    elif where == 1:
        lines[1] = nested
    elif where == 2:
        lines[1] = lines[1][:-1] + ', "frames": ' + nested + "}"
    else:
        lines[0] = lines[0][:-1] + ', "rank": ' + nested + "}"
    _parse("\n".join(lines))


@given(st.sampled_from(["1e400", "-1e400", "NaN", "Infinity", "1" * 5000, "-0", "1.5", "true", "null", '"7"']))
def test_weird_numbers_for_the_rank(num):
    _parse(SEED_TEXT.replace('"rank": 1', f'"rank": {num}', 1))
