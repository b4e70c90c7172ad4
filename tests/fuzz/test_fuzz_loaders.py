"""Fuzz the trace loaders and the analyzer behind them with mutated real Flight Recorder dumps.

Properties, for every input: `load_traces` never raises; a file it cannot use becomes one LoadError that names
that file with a one-line reason; a good file next to it still loads; whatever loads, `analyze` runs on it
without raising. A pickle that tries to run code never runs it.
"""

from __future__ import annotations

import json
import pickle
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces

from fuzz_inputs import (FR_JSON, FR_JSON_OBJ, FR_OBJ, FR_PICKLE, damaged_bytes, deep_pickle,
                         hostile_pickles, json_text, mutated_structure, versions, write)


def _check(name: str, data: bytes | str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = write(d, name, data)
        good = write(d, "good_rank_1", FR_PICKLE)
        ts = load_traces([path, good])
        # The good file always loads, whatever its neighbour holds (unless the fuzzed file claims rank 1 too).
        assert 1 in ts.ranks or any(t.path == path for t in ts.ranks.values()), ts.errors
        for err in ts.errors:
            assert err.path in (path, good) and err.reason and err.reason.isprintable(), err  # one line, no control bytes
            assert "Traceback" not in err.reason
        if not any(t.path == path for t in ts.ranks.values()):
            assert any(e.path == path for e in ts.errors), "a file that did not load must be named in an error"
        analyze(ts)


def test_seeds_load():
    with tempfile.TemporaryDirectory() as d:
        ts = load_traces([write(d, "fr_rank_0", FR_PICKLE), write(d, "fr_rank_1.json", FR_JSON)])
    assert sorted(ts.ranks) == [0, 1] and not ts.errors
    assert [e.op for e in ts.ranks[0].entries][:3] == ["all_reduce", "broadcast", "all_gather"]


@given(mutated_structure(FR_OBJ), st.integers(0, 5))
def test_mutated_fr_pickle(obj, protocol):
    try:
        data = pickle.dumps(obj, protocol=protocol)
    except (RecursionError, pickle.PicklingError):
        assume(False)
    assume(data[:1] == b"\x80" or protocol < 2)
    _check("dump_rank_0", data)


@given(damaged_bytes(FR_PICKLE))
def test_damaged_fr_pickle(data):
    _check("dump_rank_0", data)


@given(mutated_structure(FR_JSON_OBJ, allow_bytes=False))
def test_mutated_fr_json(obj):
    text = json_text(obj)
    assume(text is not None)
    _check("dump_rank_0.json", text)


@given(damaged_bytes(FR_JSON.encode()))
@example(FR_JSON.encode().replace(b'"version":"2.10"', b'"version":"2.\x7f10"'))  # a control byte in the version
def test_damaged_fr_json(data):
    _check("dump_rank_0.json", data)


@given(versions, st.sampled_from(["pickle", "json"]))
def test_wrong_versions(version, form):
    obj = dict(FR_OBJ if form == "pickle" else FR_JSON_OBJ, version=version)
    data = pickle.dumps(obj) if form == "pickle" else json_text(obj)
    _check("dump_rank_0" + (".json" if form == "json" else ""), data)


@given(st.integers(1, 200_000), st.sampled_from(["pickle", "json"]))
def test_deep_nesting(depth, form):
    if form == "pickle":
        _check("dump_rank_0", deep_pickle(depth))
        # ... and deep nesting inside an otherwise valid dump
        data = pickle.dumps(dict(FR_OBJ, entries="PLACEHOLDER"))
        _check("dump_rank_0", data.replace(pickle.dumps("PLACEHOLDER")[2:-1], deep_pickle(depth)[2:-1]))
    else:
        _check("dump_rank_0.json", '{"version": "2.10", "entries": ' + "[" * depth + "]" * depth + "}")


# JSON too: the fast JSON path once raised OverflowError on a time of 10**400 (int -> float) instead of handing
# the dump to the general path.
@given(st.sampled_from([10**30, -10**30, 2**63, 2**64 + 1, -1, float("inf"), float("nan"), 10**400]),
       st.sampled_from(["collective_seq_id", "record_id", "time_created_ns", "input_sizes", "pg_id",
                        "time_discovered_started_ns", "time_discovered_completed_ns", "timeout_ms"]),
       st.sampled_from(["pickle", "json"]))
def test_huge_numbers_in_entries(num, key, form):
    obj = pickle.loads(FR_PICKLE) if form == "pickle" else json.loads(FR_JSON)
    for e in obj["entries"]:
        e[key] = [[num]] if key == "input_sizes" else num
    if form == "pickle":
        _check("dump_rank_0", pickle.dumps(obj))
    else:
        _check("dump_rank_0.json", json.dumps(obj))


@pytest.mark.parametrize("name", sorted(hostile_pickles(Path("/nonexistent"))))
def test_hostile_pickle_never_runs(name, tmp_path):
    marker = tmp_path / "pwned"
    data = hostile_pickles(marker)[name]
    ts = load_traces([write(str(tmp_path), "dump_rank_0", data)])
    assert not marker.exists(), f"{name}: the pickle ran code"
    assert not ts.ranks and len(ts.errors) == 1
    err = ts.errors[0]
    assert err.path.endswith("dump_rank_0") and "\n" not in err.reason
    assert "refused" in err.reason or "corrupt" in err.reason or "pickle" in err.reason


# Found by test_damaged_fr_pickle (a flipped byte in a LONG_BINPUT index): CPython's C unpickler allocates and
# zeroes 16 bytes per memo slot up to the index it is told to PUT into, here 4 GiB and 64 GiB.
@pytest.mark.parametrize("data", [b"\x80\x02]r" + (2**28).to_bytes(4, "little") + b".",
                                  b"\x80\x02]r" + (2**32 - 1).to_bytes(4, "little") + b".",
                                  b"(lp4000000000\n."], ids=["LONG_BINPUT 2**28", "LONG_BINPUT 2**32-1", "PUT"])
def test_huge_memo_index_is_refused_without_allocating(data, tmp_path):
    ts = load_traces([write(str(tmp_path), "dump_rank_0", data), write(str(tmp_path), "good_rank_1", FR_PICKLE)])
    assert sorted(ts.ranks) == [1] and len(ts.errors) == 1, ts.errors
    assert "memory" in ts.errors[0].reason and ts.errors[0].path.endswith("dump_rank_0"), ts.errors


# Found by the long run: a byte of a real dump flipped into FLOAT ('F'), whose line (up to the next newline) the
# unpickler quoted raw in its error: the reason spanned two lines and carried a control byte.
@pytest.mark.parametrize("data", [b"\x80\x02]F}(h\x04X\n.", FR_PICKLE.replace(b"](}(", b"]F}(", 1)],
                         ids=["minimal", "in a real dump"])
def test_unpickler_error_quoting_the_file_stays_one_printable_line(data):
    _check("dump_rank_0", data)


@given(st.data())
def test_hostile_object_anywhere_in_a_dump(data):
    with tempfile.TemporaryDirectory() as d:
        marker = Path(d) / "pwned"
        payload = data.draw(st.sampled_from(sorted(hostile_pickles(marker).items())))[1]
        # Splice a hostile pickle's object into a valid dump at a random value position.
        obj = pickle.loads(FR_PICKLE)
        obj["entries"][data.draw(st.integers(0, len(obj["entries"]) - 1))]["state"] = "SPLICE"
        clean = pickle.dumps(obj, protocol=2)
        body = payload[2:-1] if payload[:1] == b"\x80" else payload[:-1]
        spliced = clean.replace(pickle.dumps("SPLICE", protocol=2)[2:-1], body, 1)
        ts = load_traces([write(d, "dump_rank_0", spliced)])
        assert not marker.exists()
        assert 0 not in ts.ranks or ts.ranks[0].entries  # refused, or loaded without running anything
