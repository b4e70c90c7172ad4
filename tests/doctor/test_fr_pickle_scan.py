"""The compiled pickle reader (trace/loaders/fr_pickle_scan.py) gives exactly the trace the safe unpickler's
path gives, on real Gloo dumps (written by torch's C++ pickler), NCCL-style fixtures and odd values under every
protocol; and it reads nothing the unpickler would refuse: on a damaged or hostile file it hands over, and the
unpickler's reason is the one the user sees. The reader is the C one built at install."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from distdoctor.trace.loaders import flight_recorder as fr
from distdoctor.trace.loaders.fr_pickle_scan import kernels, scan_fr_pickle
from distdoctor.trace.loaders.fr_reader import Interner
from distdoctor.trace.loaders.safe_pickle import safe_unpickle

from compiled_kernels import compiled_kernel
from test_fr_reader import ODD, SHARED_FRAME, _entry, _same


@pytest.fixture(autouse=True)
def kernel(monkeypatch):
    """Each test with the C reader."""
    from distdoctor.trace.loaders import fr_pickle_scan

    yield from compiled_kernel(monkeypatch, fr_pickle_scan, "_fr_pickle_kernel")


FIXTURES = Path(__file__).parent / "fixtures" / "nccl_style"
PROTOCOLS = (2, 3, 4, 5)


def _general(data: bytes, path: str = "rank_0"):
    """The trace (or the error) of the unpickler's path: the Python reader's."""
    try:
        return fr.parse_fr_dump(safe_unpickle(data), path, "flight_recorder-pickle")
    except ValueError as exc:
        return str(exc)


def _scanned(data: bytes, path: str = "rank_0"):
    try:
        return fr.load_fr_pickle(data, path, scan=True)
    except ValueError as exc:
        return str(exc)


def _alike(data: bytes, must_scan: bool = True) -> None:
    """The scanner's trace is the unpickler's; `must_scan`: and the scanner read it (handed nothing on)."""
    if must_scan:
        assert fr._from_pickle_scan(data, "rank_0", Interner()) is not None
    got, expected = _scanned(data), _general(data)
    if isinstance(expected, str):
        assert got == expected
        return
    assert got.source == expected.source and got.version == expected.version and got.rank == expected.rank
    assert got.world_size == expected.world_size
    _same(got, expected)


def _dump(entries: list) -> dict:
    return {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}},
            "pg_status": {}, "entries": entries}


def test_real_gloo_pickles_written_by_torch_read_alike(scenario_dumps):
    paths = sorted(scenario_dumps["dir"].glob("*/pickle/*"))
    assert len(paths) >= 8
    for path in paths:
        data = path.read_bytes()
        _alike(data, must_scan=bool(safe_unpickle(data).get("entries")))  # (a rank that recorded nothing: cheap)
        for protocol in PROTOCOLS:  # the same dump as Python's pickler writes it (MEMOIZE, FRAME, SHORT_BINUNICODE)
            _alike(pickle.dumps(safe_unpickle(data), protocol=protocol), must_scan=bool(safe_unpickle(data).get("entries")))


def test_nccl_style_fixtures_and_odd_entries_read_alike():
    objs = [safe_unpickle(path.read_bytes()) for path in sorted(FIXTURES.iterdir())] + [_dump(ODD)]
    for obj in objs:
        for protocol in PROTOCOLS:
            _alike(pickle.dumps(obj, protocol=protocol))


@pytest.mark.parametrize("change", [
    {"input_dtypes": [1]}, {"input_dtypes": [True]}, {"input_dtypes": ("Float",)}, {"input_dtypes": "Float"},
    {"thread_name": 7}, {"thread_name": "é线程\udc80"}, {"thread_name": None}, {"collective_seq_id": 3.0},
    {"collective_seq_id": True}, {"collective_seq_id": None}, {"collective_seq_id": "4"}, {"record_id": 2 ** 70},
    {"record_id": -5}, {"record_id": 2 ** 63 - 1}, {"record_id": -2 ** 63}, {"time_created_ns": 2 ** 64},
    {"time_created_ns": 2 ** 63}, {"time_created_ns": 1.5e18}, {"time_created_ns": 0}, {"time_created_ns": -1},
    {"input_sizes": [[4.0, 2]]}, {"input_sizes": ([4, 2],)}, {"input_sizes": [[True, 2]]}, {"input_sizes": []},
    {"input_sizes": [[4, 2], [1]]}, {"input_sizes": [[2 ** 40, 70000, 255, 256, -1]]}, {"retired": 1},
    {"retired": None}, {"state": "bogus"}, {"is_p2p": 1}, {"process_group": ("1", "tp")}, {"process_group": ["1"]},
    {"process_group": [1, "tp"]}, {"process_group": None}, {"profiling_name": "nccl:send 0->1"}, {"frames": None},
    {"frames": [SHARED_FRAME, SHARED_FRAME]}, {"frames": [{"name": "f", "filename": "a.py", "line": 1.0}]},
    {"frames": [{"name": "f", "filename": "a.py", "line": True}]}, {"frames": [{"name": "f", "line": 3}]},
    {"frames": "train.py"}, {"extra": {"nested": [1, (2, 3)], "b": b"bytes"}}, {"input_sizes": [[4, 2]] * 3},
])
def test_an_odd_value_reads_alike(change):
    """One entry among ordinary ones takes an odd value: the scanner gives the unpickler's trace or error."""
    entries = [_entry(record_id=i, collective_seq_id=i + 1, frames=[SHARED_FRAME]) for i in range(4)]
    entries[2].update(change)
    for protocol in PROTOCOLS:
        _alike(pickle.dumps(_dump(entries), protocol=protocol), must_scan=False)


class _Pairs(list):
    """A dict written from (key, value) pairs as they are, a key given twice included."""


class _PairsPickler(pickle._Pickler):
    dispatch = dict(pickle._Pickler.dispatch)

    def save_pairs(self, obj):
        self.write(pickle.EMPTY_DICT + pickle.MARK)
        for key, value in obj:
            self.save(key)
            self.save(value)
        self.write(pickle.SETITEMS)

    dispatch[_Pairs] = save_pairs


def _pairs_pickle(obj) -> bytes:
    import io

    out = io.BytesIO()
    _PairsPickler(out, protocol=2).dump(obj)
    return out.getvalue()


def test_shared_values_and_repeated_keys_read_alike():
    """The memo in play: one list object in every entry, one dict as two entries; and an entry whose keys are
    given twice (the last value counts, as in the unpickler)."""
    sizes = [[8, 8]]
    shared = _entry(record_id=9, input_sizes=sizes)
    entries = [_entry(record_id=i, input_sizes=sizes, output_sizes=sizes) for i in range(3)] + [shared, shared]
    _alike(pickle.dumps(_dump(entries), protocol=4))
    twice = _Pairs([*_entry(record_id=1).items(), ("state", "scheduled"), ("retired", False), ("record_id", 5)])
    data = _pairs_pickle(_dump([_entry(record_id=0), twice]))
    assert safe_unpickle(data)["entries"][1]["record_id"] == 5
    _alike(data)
    assert fr.load_fr_pickle(data, "rank_0", scan=True).entries[1].state == "issued"


# Files the unpickler refuses or reads differently: the scanner must hand each one over.
HOSTILE = {
    "a global": b"\x80\x02cos\nsystem\nq\x00.",
    "a stack global": b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x93\x94.",
    "truncated": pickle.dumps(_dump(ODD), protocol=4)[:-40],
    "no STOP": pickle.dumps(_dump(ODD), protocol=2)[:-1],
    "a memo slot never filled": b"\x80\x02}q\x00h\x07.",
    "an APPEND below a MARK": b"\x80\x02]q\x00(K\x01a.",
    "a PUT with nothing above its MARK": b"\x80\x02](q\x00K\x01e.",
    "STOP with nothing above a MARK": b"\x80\x02](.",
    "bad UTF-8": b"\x80\x02}q\x00X\x02\x00\x00\x00\xc3\x28K\x01s.",
    "an overlong UTF-8": b"\x80\x02}q\x00X\x02\x00\x00\x00\xc0\xafK\x01s.",
    "a list that contains itself": b"\x80\x02}(X\x07\x00\x00\x00versionX\x01\x00\x00\x002X\x07\x00\x00\x00entries]"
                                   b"q\x00(}(X\x06\x00\x00\x00framesh\x00X\t\x00\x00\x00record_idK\x00ueu.",
    "a list as a dict key": b"\x80\x02}]K\x01s.",
    "protocol 6": b"\x80\x06N.",
    "SETITEMS on a list": b"\x80\x02](K\x01K\x02u.",
    "odd SETITEMS": b"\x80\x02}(K\x01u.",
    "a frame longer than the file": b"\x80\x04\x95\xff\x00\x00\x00\x00\x00\x00\x00N.",
    "a negative LONG4 length": b"\x80\x02\x8b\xff\xff\xff\xffN.",
    "protocol 0 text": b"(dp0\nVversion\np1\nV2\np2\ns.",
    # A 3-byte frame ends inside BINUNICODE's length: pickle.loads reads 'abc', the unpickler of a file does not.
    "an opcode split across a frame's end": b"\x80\x04\x95\x03\x00\x00\x00\x00\x00\x00\x00X\x03\x00\x00\x00abc.",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_damaged_or_hostile_file_is_handed_to_the_unpickler(name):
    data = HOSTILE[name]
    assert scan_fr_pickle(data) is None
    assert _scanned(data) == _general(data)  # the unpickler's reason (or its trace), word for word


def test_a_header_without_entries_is_the_unpickler_s_to_word():
    for obj in ({"version": "2.10", "pg_config": {}}, {"version": "2.10", "entries": []}, [1, 2], {"entries": 3}):
        data = pickle.dumps(obj, protocol=4)
        assert _scanned(data) == _general(data)


_ODD_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False)
    | st.text(max_size=6) | st.sampled_from(["0", "1", "Float", "nccl:all_reduce", "completed", "scheduled"]),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
    | st.dictionaries(st.sampled_from(["name", "filename", "line"]), inner, max_size=3),
    max_leaves=6)
_FIELDS = ["record_id", "collective_seq_id", "p2p_seq_id", "time_created_ns", "time_discovered_started_ns",
           "time_discovered_completed_ns", "process_group", "profiling_name", "input_sizes", "output_sizes",
           "input_dtypes", "output_dtypes", "state", "retired", "thread_name", "is_p2p", "frames"]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.dictionaries(st.sampled_from(_FIELDS), _ODD_VALUES, max_size=4), min_size=1, max_size=4),
       st.sampled_from(PROTOCOLS))
def test_random_odd_values_read_alike(changes, protocol):
    entries = [_entry(record_id=i, collective_seq_id=i + 1) for i in range(len(changes))]
    for entry, change in zip(entries, changes):
        entry.update(copy.deepcopy(change))
    _alike(pickle.dumps(_dump(entries), protocol=protocol), must_scan=False)


_BASE = pickle.dumps(_dump([_entry(record_id=i, collective_seq_id=i + 1) for i in range(3)]), protocol=2)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, len(_BASE) - 1), st.integers(0, 255)), min_size=1, max_size=3))
@example([(2, 0x28)])  # a MARK where the dict opens
@example([(891, 19)])  # a list where a key was: the unpickler reads it, the entry is malformed
def test_a_damaged_file_the_scanner_reads_the_unpickler_reads_alike(flips):
    """Bytes changed at random: whatever the scanner accepts, the unpickler accepts and reads the same."""
    data = bytearray(_BASE)
    for at, value in flips:
        data[at] = value
    data = bytes(data)
    if scan_fr_pickle(data) is not None:
        safe_unpickle(data)  # the unpickler reads it too (raises otherwise)
    _alike(data, must_scan=False)


def test_a_reader_that_cannot_start_is_named_and_the_pickles_still_load(tmp_path, monkeypatch, capsys, kernel):
    """A reader there but unable to run (built for another machine, say): the unpickler loads the set and the
    CLI says why (a silent fallback would leave a user wondering why 16 384 pickles take three times as long)."""
    import json

    from distdoctor.trace.loaders import _fr_pickle_kernel as k
    from distdoctor.cli import main
    from distdoctor.trace.loaders import fr_pickle_scan, load_traces

    def broken(*args):
        raise RuntimeError("no LLVM target for this machine")

    monkeypatch.setattr(k, "run", broken)
    kernels.cache_clear()
    try:
        for r in range(64):
            entries = [_entry(record_id=i, collective_seq_id=i + 1) for i in range(4)]
            (tmp_path / f"rank_{r}").write_bytes(pickle.dumps(_dump(entries), protocol=4))
        assert kernels() is None and "no LLVM target" in fr_pickle_scan.FAILURE
        assert sorted(load_traces([str(tmp_path)]).ranks) == list(range(64))
        with pytest.raises(SystemExit):
            main(["diagnose", str(tmp_path), "--format", "json"])
        out, err = capsys.readouterr()
        assert json.loads(out)["world_size"] == 64
        assert "the compiled pickle reader could not start (RuntimeError: no LLVM target" in err
    finally:
        monkeypatch.undo()
        kernels.cache_clear()
        fr_pickle_scan.FAILURE = None
    assert kernels() is not None  # (the environment is back as it was: the C reader where built)


def test_the_c_reader_refuses_arrays_and_tables_that_do_not_fit(kernel):
    """The C kernels check every array they are given and every index they follow: a caller's mistake or a
    corrupt node table is an error or FAIL, never a read or write out of bounds."""
    import numpy as np

    from distdoctor.trace.loaders import _fr_pickle_kernel as c

    data = pickle.dumps(_dump([_entry(record_id=i, collective_seq_id=i + 1) for i in range(3)]), protocol=4)
    buf = np.frombuffer(data, np.uint8)
    cap = len(data) + 1
    nodes = [np.zeros(cap + 1, np.int8)] + [np.zeros(cap + 1, np.int64) for _ in range(4)]
    rest = [np.zeros(cap, np.int64) for _ in range(5)]
    root = np.zeros(2, np.int64)
    assert c.run(buf, *nodes, *rest, root) > 0
    with pytest.raises(ValueError):
        c.run(buf, *nodes, *rest, root[:1])
    with pytest.raises(ValueError):
        c.run(buf, nodes[0].astype(np.int64), *nodes[1:], *rest, root)
    head, nxt = nodes[3], rest[1]
    assert c.count_items(int(root[0]), head, nxt) == 8  # the top dict's four keys and their values
    nxt[:] = np.arange(1, cap + 1)  # a chain running past the table's end stops there
    assert c.count_items(0, np.zeros(1, np.int64), nxt) == cap
