"""The field-by-field reader of Flight Recorder entries (trace/loaders/fr_columns.py) gives exactly the row
reader's trace, on real Gloo dumps, NCCL-style fixtures and odd entries; where it cannot read an entry the row
reader does, with the same error."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from distdoctor.trace.loaders import flight_recorder as fr
from distdoctor.trace.loaders.safe_pickle import safe_unpickle

FIXTURES = Path(__file__).parent / "fixtures" / "nccl_style"


def _both(obj: dict, monkeypatch) -> tuple:
    fast = fr.parse_fr_dump(copy.deepcopy(obj), "rank_0", "flight_recorder-pickle")
    with monkeypatch.context() as m:
        m.setattr(fr, "entry_columns", lambda *a: None)  # the row reader alone
        rows = fr.parse_fr_dump(copy.deepcopy(obj), "rank_0", "flight_recorder-pickle")
    return fast, rows


def _same(fast, rows) -> None:
    assert list(fast.entries.columns) == list(rows.entries.columns)
    assert fast.groups == rows.groups
    assert list(fast.entries) == list(rows.entries)


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
