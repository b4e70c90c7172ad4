"""The Python Flight Recorder reader (trace/loaders/fr_reader.py, by the field table fr_schema.py): on real Gloo
dumps, NCCL-style fixtures and odd entries it gives what an entry means field by field (checked against a
reading of each entry alone, in the model's own terms); a value the model cannot take is one error naming the
entry's index and the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from distdoctor.trace.loaders import flight_recorder as fr
from distdoctor.trace.loaders.safe_pickle import safe_unpickle
from distdoctor.trace.model import RankTrace

FIXTURES = Path(__file__).parent / "fixtures" / "nccl_style"


def _read(obj: dict):
    return fr.parse_fr_dump(copy.deepcopy(obj), "rank_0", "flight_recorder-pickle")


def _one_by_one(obj: dict) -> list:
    """Each entry read alone (its own dump, its own interner): what the whole read must give, entry by entry."""
    out = []
    for i, raw in enumerate(obj["entries"]):
        alone = _read({**obj, "entries": [raw]}).entries[0]
        if "record_id" not in raw:
            alone.index = i  # (a missing record_id is the entry's position)
        out.append(alone)
    return out


def _same(fast, rows) -> None:
    assert fast.groups == rows.groups
    assert list(fast.entries) == list(rows.entries)
    assert [fast.entries[i] for i in range(len(rows.entries))] == list(rows.entries)  # one by one
    for name in ("group", "seq", "in_sizes", "frames", "t_created", "peer"):  # columns, without building entries
        assert fast.entries.column(name) == [getattr(e, name) for e in rows.entries]


def _entry(**kw) -> dict:
    e = {"record_id": 0, "process_group": ["1", "tp"], "collective_seq_id": 1, "p2p_seq_id": 0,
         "profiling_name": "nccl:all_reduce", "input_sizes": [[4, 2]], "output_sizes": [[4, 2]],
         "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": "completed", "retired": True,
         "time_created_ns": 1_000_000_000, "time_discovered_started_ns": 0, "time_discovered_completed_ns": None,
         "thread_name": "pt_main_thread", "is_p2p": False,
         "frames": [{"name": "step", "filename": "train.py", "line": 40}]}
    e.update(kw)
    return e


ODD = [
    _entry(),
    _entry(record_id=1, time_discovered_started_ns=2_000_000_000, time_discovered_completed_ns=3_500_000_000,
           profiling_name="nccl:send 0->1", is_p2p=True, p2p_seq_id=3, collective_seq_id=0),
    _entry(record_id=2, profiling_name="nccl:recv 1<-0", p2p_seq_id=4, state="started", retired=False),
    _entry(record_id=3, process_group=["0", "default_pg"], input_sizes=[[1], [2, 3]], input_dtypes=["Float", "Long"],
           thread_name="", frames=[]),
    _entry(record_id=4, profiling_name="gloo:mystery_op", state="scheduled", retired=False, output_sizes=None),
]


def test_odd_entries_mean_what_the_table_says():
    obj = {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}, "entries": ODD}
    trace = _read(obj)
    assert list(trace.entries) == _one_by_one(obj)
    e = trace.entries
    assert [x.state for x in e] == ["completed", "completed", "started", "completed", "issued"]  # retired wins
    assert [x.group for x in e] == ["1", "1", "1", "0", "1"]
    assert (e[1].peer, e[2].peer) == (1, 0) and (e[1].seq, e[1].p2p_seq) == (None, 3)  # group-local peer -> global
    assert (e[0].seq, e[0].p2p_seq) == (1, None) and e[0].in_dtypes == ["float32"]
    assert e[1].t_started == 2.0 and e[0].t_started is None  # 0 ns: unknown
    assert e[3].in_sizes == [[1], [2, 3]] and e[3].in_dtypes == ["float32", "int64"] and e[3].stream is None
    assert e[4].op == "other:gloo:mystery_op" and e[4].out_sizes == []
    assert e[0].frames[0].filename == "train.py" and e[3].frames == []
    assert trace.groups["0"].inferred and trace.groups["0"].desc == "default_pg"  # not in pg_config


def test_a_damaged_entry_is_named_by_its_index_and_field(tmp_path):
    obj = {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}, "entries": ODD}
    for change, field in (({"profiling_name": None}, "profiling_name"),
                          ({"collective_seq_id": "x"}, "collective_seq_id"),
                          ({"input_sizes": [["a"]]}, "input_sizes"), ({"record_id": None}, "record_id"),
                          ({"frames": [{"name": "f"}]}, "frames"),
                          ({"time_created_ns": 2 ** 64}, "time_created_ns")):
        bad = copy.deepcopy(obj)
        bad["entries"][3].update(change)
        with pytest.raises(ValueError, match=rf"^entry 3 is malformed \(field '{field}'"):
            _read(bad)
    bad = copy.deepcopy(obj)
    del bad["entries"][3]["profiling_name"]
    with pytest.raises(ValueError, match=r"^entry 3 is malformed \(field 'profiling_name' is missing\)$"):
        _read(bad)
    bad["entries"][3] = ["not", "a", "dict"]
    with pytest.raises(ValueError, match=r"^entry 3 is malformed \(TypeError: a list, not a dict\)$"):
        _read(bad)


def test_nccl_style_fixtures_read_alike():
    for path in sorted(FIXTURES.iterdir()):
        obj = safe_unpickle(path.read_bytes())
        assert list(_read(obj).entries) == _one_by_one(obj)


def test_real_gloo_dumps_read_alike(scenario_dumps):
    paths = sorted(scenario_dumps["dir"].glob("*/pickle/*"))
    assert len(paths) >= 8
    for path in paths:
        obj = safe_unpickle(path.read_bytes())
        assert list(_read(obj).entries) == _one_by_one(obj)


def test_the_summary_and_digest_are_those_of_the_entries():
    """The compact form's per-rank summary and digest equal those of the same entries as a plain list."""
    from distdoctor.trace.loaders.stream import RankDigest, _signatures
    from distdoctor.trace.summary import _compute

    objs = [{"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}, "entries": ODD}]
    objs += [safe_unpickle(path.read_bytes()) for path in sorted(FIXTURES.iterdir())]
    for obj in objs:
        compact = _read(obj)
        plain = RankTrace(0, "flight_recorder-pickle", entries=list(compact.entries))
        assert _compute(compact) == _compute(plain)
        da, db = RankDigest(0), RankDigest(0)
        (ids_a, done_a), (ids_b, done_b) = _signatures(compact, da), _signatures(plain, db)
        assert [da.keys[i] for i in ids_a.tolist()] == [db.keys[i] for i in ids_b.tolist()]  # same values
        assert done_a.tolist() == done_b.tolist()


SHARED_FRAME = {"name": "step", "filename": "train.py", "line": 40}


@pytest.mark.parametrize("change", [
    {"input_dtypes": [1]}, {"input_dtypes": [True]}, {"input_dtypes": ("Float",)}, {"input_dtypes": "Float"},
    {"input_dtypes": ["Float", 2]}, {"thread_name": 7}, {"thread_name": ""}, {"thread_name": None},
    {"collective_seq_id": 3.0}, {"collective_seq_id": True}, {"collective_seq_id": None}, {"collective_seq_id": "4"},
    {"record_id": 2 ** 70}, {"time_created_ns": 2 ** 64}, {"time_created_ns": 1.5e18}, {"time_created_ns": 0},
    {"input_sizes": [[4.0, 2]]}, {"input_sizes": ([4, 2],)}, {"input_sizes": [[True, 2]]}, {"input_sizes": []},
    {"input_sizes": [[4, 2], [1]]}, {"input_sizes": [["4", 2]]}, {"retired": 1}, {"retired": None},
    {"state": "bogus"}, {"is_p2p": 1}, {"process_group": ("1", "tp")}, {"process_group": ["1"]},
    {"process_group": [1, "tp"]}, {"profiling_name": "nccl:send 0->1"}, {"frames": None},
    {"frames": [SHARED_FRAME, SHARED_FRAME]}, {"frames": [{"name": "f", "filename": "a.py", "line": 1.0}]},
    {"frames": [{"name": "f", "filename": "a.py", "line": True}]}, {"state": ["completed"]}, {"thread_name": {1}},
    {"p2p_seq_id": "junk"}, {"is_p2p": True, "p2p_seq_id": 7},
])
def test_an_odd_value_reads_as_that_entry_alone_reads(change):
    """One entry among ordinary ones (before and after it) takes an odd value: the whole read gives, entry by
    entry, what each entry read alone gives, or names that entry's field; an integer beyond 64 bits is refused."""
    entries = [_entry(record_id=i, collective_seq_id=i + 1, frames=[SHARED_FRAME]) for i in range(4)]
    entries[2].update(change)
    obj = {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}, "entries": entries}
    try:
        alone = _one_by_one(obj)
    except ValueError as exc:
        assert str(exc).startswith("entry 0 is malformed (field ")  # (read alone, the entry is entry 0)
        with pytest.raises(ValueError, match=r"^entry 2 is malformed \(field '"):
            _read(obj)
        return
    assert list(_read(obj).entries) == alone
    assert change not in ({"record_id": 2 ** 70}, {"time_created_ns": 2 ** 64})


def test_a_list_that_contains_itself_is_one_error_naming_its_field():
    """A damaged pickle can hold a list that contains itself (a memo slot fetched inside the list): keying it
    stops at a depth no dump reaches, and the entry is named with its field, never a RecursionError."""
    looped: list = []
    looped.append(looped)
    entries = [_entry(record_id=i, collective_seq_id=i + 1) for i in range(4)]
    entries[2]["input_sizes"] = [looped]
    obj = {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}, "entries": entries}
    with pytest.raises(ValueError, match=r"^entry 2 is malformed \(field 'input_sizes'"):
        fr.parse_fr_dump(obj, "rank_0", "flight_recorder-pickle")
