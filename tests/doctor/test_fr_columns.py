"""The compact reader of Flight Recorder entries (trace/loaders/fr_coded.py) and the field-by-field reader
(fr_columns.py) give exactly the row reader's trace, on real Gloo dumps, NCCL-style fixtures and odd entries;
where they cannot read an entry the row reader does, with the same error."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from distdoctor.trace.loaders import flight_recorder as fr
from distdoctor.trace.loaders.safe_pickle import safe_unpickle

FIXTURES = Path(__file__).parent / "fixtures" / "nccl_style"


def _all(obj: dict, monkeypatch) -> tuple:
    """The trace as each reader gives it: compact, field by field, row by row."""
    compact = fr.parse_fr_dump(copy.deepcopy(obj), "rank_0", "flight_recorder-pickle")
    with monkeypatch.context() as m:
        m.setattr(fr, "coded_parts", lambda *a: None)
        columns = fr.parse_fr_dump(copy.deepcopy(obj), "rank_0", "flight_recorder-pickle")
        m.setattr(fr, "entry_columns", lambda *a: None)  # the row reader alone
        rows = fr.parse_fr_dump(copy.deepcopy(obj), "rank_0", "flight_recorder-pickle")
    return compact, columns, rows


def _both(obj: dict, monkeypatch) -> tuple:
    compact, columns, rows = _all(obj, monkeypatch)
    _same(compact, rows)
    return columns, rows


def _same(fast, rows) -> None:
    assert list(fast.entries.columns) == list(rows.entries.columns)
    assert fast.groups == rows.groups
    assert list(fast.entries) == list(rows.entries)
    assert [fast.entries[i] for i in range(len(rows.entries))] == list(rows.entries)  # one by one (coded.entry)


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


def test_odd_entries_read_alike(monkeypatch):
    obj = {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}, "entries": ODD}
    fast, rows = _both(obj, monkeypatch)
    _same(fast, rows)
    assert fast.entries.column("peer")[1:3] == rows.entries.column("peer")[1:3]
    bad = copy.deepcopy(obj)
    del bad["entries"][3]["profiling_name"]
    with pytest.raises(ValueError, match=r"entry 3 is malformed \(missing key 'profiling_name'\)"):
        fr.parse_fr_dump(bad, "rank_0", "flight_recorder-pickle")


def test_nccl_style_fixtures_read_alike(monkeypatch):
    for path in sorted(FIXTURES.iterdir()):
        _same(*_both(safe_unpickle(path.read_bytes()), monkeypatch))


def test_real_gloo_dumps_read_alike(scenario_dumps, monkeypatch):
    paths = sorted(scenario_dumps["dir"].glob("*/pickle/*"))
    assert len(paths) >= 8
    for path in paths:
        _same(*_both(safe_unpickle(path.read_bytes()), monkeypatch))


def test_the_compact_reader_takes_ordinary_dumps(monkeypatch):
    """Pickles of NCCL-style fixtures and the ODD entries are read in compact form (not handed on), and their
    per-rank summary and digest are those of the column reader's trace."""
    from distdoctor.trace.loaders.stream import RankDigest, _signatures
    from distdoctor.trace.summary import _compute

    objs = [{"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}, "entries": ODD}]
    objs += [safe_unpickle(path.read_bytes()) for path in sorted(FIXTURES.iterdir())]
    for obj in objs:
        compact, columns, _ = _all(obj, monkeypatch)
        assert compact.entries.coded is not None and columns.entries.coded is None
        assert _compute(compact) == _compute(columns)
        da, db = RankDigest(0), RankDigest(0)
        (ids_a, done_a), (ids_b, done_b) = _signatures(compact, da), _signatures(columns, db)
        assert [da.keys[i] for i in ids_a.tolist()] == [db.keys[i] for i in ids_b.tolist()]  # same values
        assert done_a.tolist() == done_b.tolist()


SHARED_FRAME = {"name": "step", "filename": "train.py", "line": 40}


@pytest.mark.parametrize("change", [
    # what the compact reader must hand on (or key apart), each against the row reader's trace
    {"input_dtypes": [1]}, {"input_dtypes": [True]}, {"input_dtypes": ("Float",)}, {"input_dtypes": "Float"},
    {"input_dtypes": ["Float", 2]}, {"thread_name": 7}, {"thread_name": ""}, {"thread_name": None},
    {"collective_seq_id": 3.0}, {"collective_seq_id": True}, {"collective_seq_id": None}, {"collective_seq_id": "4"},
    {"record_id": 2 ** 70}, {"time_created_ns": 2 ** 64}, {"time_created_ns": 1.5e18}, {"time_created_ns": 0},
    {"input_sizes": [[4.0, 2]]}, {"input_sizes": ([4, 2],)}, {"input_sizes": [[True, 2]]}, {"input_sizes": []},
    {"input_sizes": [[4, 2], [1]]}, {"input_sizes": [["4", 2]]}, {"retired": 1}, {"retired": None},
    {"state": "bogus"}, {"is_p2p": 1}, {"process_group": ("1", "tp")}, {"process_group": ["1"]},
    {"process_group": [1, "tp"]}, {"profiling_name": "nccl:send 0->1"}, {"frames": None},
    {"frames": [SHARED_FRAME, SHARED_FRAME]}, {"frames": [{"name": "f", "filename": "a.py", "line": 1.0}]},
    {"frames": [{"name": "f", "filename": "a.py", "line": True}]},
])
def test_an_odd_value_reads_as_the_row_reader_reads_it(change, monkeypatch):
    """One entry among ordinary ones (before and after it) takes an odd value: every reader gives the row
    reader's trace, or the row reader's error."""
    entries = [_entry(record_id=i, collective_seq_id=i + 1, frames=[SHARED_FRAME]) for i in range(4)]
    entries[2].update(change)
    obj = {"version": "2.10", "pg_config": {"1": {"name": "1", "desc": "tp", "ranks": "[0, 1]"}}, "entries": entries}
    try:
        expected = fr.parse_fr_dump(copy.deepcopy(obj), "rank_0", "flight_recorder-pickle")
    except ValueError as exc:
        with monkeypatch.context() as m:
            m.setattr(fr, "coded_parts", lambda *a: None)
            m.setattr(fr, "entry_columns", lambda *a: None)
            with pytest.raises(ValueError, match=str(exc).replace("(", r"\(").replace(")", r"\)")):
                fr.parse_fr_dump(copy.deepcopy(obj), "rank_0", "flight_recorder-pickle")
        return
    compact, columns, rows = _all(obj, monkeypatch)
    _same(compact, rows)
    _same(columns, rows)
    _same(expected, rows)
