"""Loaders on hand-made edge cases: NCCL style, Gloo quirks, hostile pickles, and every kind of bad file."""

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_file, load_traces
from distdoctor.trace.loaders.flight_recorder import rank_from_filename, safe_unpickle

FIX = Path(__file__).parent / "fixtures"


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_hostile_pickle_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    evil = {"version": "2.10", "pg_config": {}, "entries": [_Evil(marker)]}
    for proto in (0, 2, 4, 5):
        path = tmp_path / f"evil_rank_{proto}.pkl"
        path.write_bytes(pickle.dumps(evil, protocol=proto))
        with pytest.raises(ValueError, match=r"refused to load (posix|os)\.system"):
            load_file(str(path))
    ts = load_traces([str(tmp_path)])
    assert not marker.exists()
    assert not ts.ranks and len(ts.errors) == 4
    assert all("refused to load" in e.reason and e.path.endswith(".pkl") for e in ts.errors)


def test_safe_unpickler_refuses_every_global_but_builds_containers():
    data = {"a": [1, 2.5, None, True], "b": (b"x", "y"), "c": {1, 2}, "d": frozenset({3})}
    assert safe_unpickle(pickle.dumps(data, protocol=2)) == data
    assert safe_unpickle(pickle.dumps(data, protocol=5)) == data
    for obj in (Path("/x"), pickle.Pickler, print):
        with pytest.raises(ValueError, match="refused"):
            safe_unpickle(pickle.dumps(obj))


def test_nccl_style_dump(tmp_path):
    ts = load_traces([str(FIX / "nccl_style")])
    assert ts.errors == [] and sorted(ts.ranks) == [0, 1, 2, 3] and ts.world_size == 4
    t2 = ts.ranks[2]
    assert t2.source == "flight_recorder-pickle" and t2.version == "2.4"
    assert t2.groups["1"].ranks == [2, 3] and not t2.groups["1"].inferred and t2.groups["1"].desc == "pp"
    send = t2.entries[-1]
    assert (send.op, send.peer, send.p2p_seq, send.seq, send.raw_op) == ("send", 3, 1, None, "nccl:send 0->1")
    recv = ts.ranks[3].entries[-1]
    assert (recv.op, recv.peer) == ("recv", 2)
    assert ts.ranks[1].entries[2].state == "started"
    assert ts.ranks[0].entries[0].frames[0].name == "train_step"
    report = analyze(ts)
    assert [(f.kind, f.ranks, f.group, f.seq, f.op) for f in report.findings] == [
        ("state_mismatch", [1], "0", 3, "all_reduce")]


def test_gloo_default_group_and_inferred_membership(tmp_path):
    """Gloo: pg_config names the default group '' with no ranks; entries say ('0', 'default_pg');
    subgroups are absent from pg_config; entries stay 'scheduled' and complete via 'retired'."""
    def e(i, group, seq, retired, name="gloo:all_reduce"):
        return {"record_id": i, "pg_id": 0, "process_group": [group, "default_pg" if group == "0" else "undefined"],
                "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": name,
                "time_created_ns": 10**18 + i, "input_sizes": [[4]], "input_dtypes": ["Float"],
                "output_sizes": [[4]], "output_dtypes": ["Float"], "state": "scheduled",
                "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0, "retired": retired,
                "timeout_ms": 5000, "is_p2p": False}
    for rank in range(3):
        entries = [e(0, "0", 1, True)]
        if rank in (1, 2):
            entries.append(e(1, "2", 1, rank == 2))
        dump = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}},
                "pg_status": {}, "comm_lib_version": "", "entries": entries}
        (tmp_path / f"fr_{rank}.json").write_text(json.dumps(dump))
    ts = load_traces([str(tmp_path)], world_size=3)
    assert ts.errors == []
    g = ts.ranks[1].groups
    assert set(g) == {"0", "2"} and g["0"].ranks == [0, 1, 2] and g["0"].inferred
    assert g["2"].ranks == [1, 2] and g["2"].inferred
    assert [x.state for x in ts.ranks[1].entries] == ["completed", "issued"]
    assert ts.ranks[0].entries[0].t_started is None  # JSON's 0 means unknown
    report = analyze(ts)
    assert [(f.kind, f.ranks, f.group, f.seq) for f in report.findings] == [("state_mismatch", [1], "2", 1)]
    assert report.to_json()["groups"]["2"] == {"members": [1, 2], "inferred": True, "desc": ""}


@pytest.mark.parametrize("name, rank", [("nccl_trace_rank_3", 3), ("fr_trace_rank_12.pkl", 12),
                                        ("dump-7.json", 7), ("rank0", 0), ("trace.json", None)])
def test_rank_from_file_name(name, rank):
    assert rank_from_filename(f"/some/dir/{name}") == rank


def test_bad_files_each_named_with_reason_and_others_still_load(tmp_path):
    for p in (FIX / "bad").iterdir():
        shutil.copy(p, tmp_path / p.name)
    shutil.copy(FIX / "nccl_style" / "nccl_trace_rank_0", tmp_path / "good_rank_0")
    shutil.copy(FIX / "nccl_style" / "nccl_trace_rank_1", tmp_path / "good_rank_1")
    ts = load_traces([str(tmp_path)])
    assert sorted(ts.ranks) == [0, 1]
    reasons = {Path(e.path).name: e.reason for e in ts.errors}
    assert reasons["truncated_rank_0.pkl"].startswith("corrupt or truncated pickle")
    assert reasons["empty_rank_1.pkl"] == "empty file"
    assert "corrupt pickle" in reasons["corrupt_rank_2.pkl"] or "truncated" in reasons["corrupt_rank_2.pkl"]
    assert "not a trace" in reasons["foreign_rank_3.json"]
    assert "unrecognized format" in reasons["notes.txt"]
    assert "unsupported Flight Recorder version '1.5'" in reasons["old_version_rank_1.json"]
    assert "truncated JSON" in reasons["truncated_rank_2.json"]
    assert len(reasons) == 7


def test_duplicate_rank_and_mixed_versions(tmp_path):
    src = FIX / "nccl_style"
    for r in range(4):
        shutil.copy(src / f"nccl_trace_rank_{r}", tmp_path / f"a_rank_{r}")
    shutil.copy(src / "nccl_trace_rank_2", tmp_path / "b_rank_2")  # the same rank twice
    other = pickle.loads((src / "nccl_trace_rank_3").read_bytes())
    other["version"] = "2.2"
    (tmp_path / "c_rank_5").write_bytes(pickle.dumps(other))
    ts = load_traces([str(tmp_path)])
    assert sorted(ts.ranks) == [0, 1, 2, 3]
    reasons = {Path(e.path).name: e.reason for e in ts.errors}
    assert reasons["b_rank_2"].startswith("duplicate rank 2: already loaded from") and "a_rank_2" in reasons["b_rank_2"]
    assert "version 2.2 differs from the other dumps' 2.4" in reasons["c_rank_5"]


def test_missing_paths_and_malformed_entries(tmp_path):
    dump = pickle.loads((FIX / "nccl_style" / "nccl_trace_rank_0").read_bytes())
    del dump["entries"][1]["process_group"]
    (tmp_path / "x_rank_0").write_bytes(pickle.dumps(dump))
    dump["entries"] = {"not": "a list"}
    (tmp_path / "y_rank_1").write_bytes(pickle.dumps(dump))
    (tmp_path / "noname.json").write_text(json.dumps({"version": "2.10", "pg_config": {}, "entries": []}))
    ts = load_traces([str(tmp_path), str(tmp_path / "nope")])
    reasons = {Path(e.path).name: e.reason for e in ts.errors}
    assert reasons["x_rank_0"] == "entry 1 is malformed (field 'process_group' is missing)"
    assert reasons["y_rank_1"] == "'entries' is dict, not a list"
    assert reasons["noname.json"].startswith("cannot tell which rank")
    assert reasons["nope"] == "no such file or directory"


def test_cli_unusable_input_exits_2_with_one_line(tmp_path, run_cli):
    (tmp_path / "empty_rank_0").write_bytes(b"")
    res = run_cli("diagnose", str(tmp_path))
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert lines[0].startswith("distdoctor diagnose: error:") and "empty_rank_0: empty file" in lines[0]
    res = run_cli("diagnose", str(FIX / "nccl_style"), str(FIX / "bad" / "notes.txt"), "--format", "json")
    assert res.returncode == 1
    doc = json.loads(res.stdout)
    assert doc["load_errors"][0]["path"].endswith("notes.txt")
    assert "warning:" in res.stderr and "notes.txt" in res.stderr


def test_diagnose_runs_without_torch(tmp_path):
    """Loaders and the analyzer are pure Python: diagnose works where torch cannot even be imported."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "from distdoctor.cli import main\n"
            f"main(['diagnose', {str(FIX / 'nccl_style')!r}, '--format', 'json'])\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stderr
    assert json.loads(res.stdout)["findings"][0]["kind"] == "state_mismatch"


def test_parallel_load_gives_the_same_traces(tmp_path):
    for p in (FIX / "bad").iterdir():
        shutil.copy(p, tmp_path / p.name)
    for r in range(4):
        shutil.copy(FIX / "nccl_style" / f"nccl_trace_rank_{r}", tmp_path / f"nccl_trace_rank_{r}")
    serial = load_traces([str(tmp_path)], jobs=1)
    parallel = load_traces([str(tmp_path)], jobs=2)
    assert sorted(map(str, serial.errors)) == sorted(map(str, parallel.errors))
    for r in serial.ranks:
        assert serial.ranks[r].entries == parallel.ranks[r].entries
        assert serial.ranks[r].groups == parallel.ranks[r].groups
    a, b = parallel.ranks[0].entries[0], parallel.ranks[3].entries[0]
    assert a.in_sizes is b.in_sizes  # equal lists are shared again across ranks after the trip
    assert [(f.kind, f.ranks) for f in analyze(parallel).findings] == [("state_mismatch", [1])]


def test_directory_with_a_fifo_loads_its_dumps_and_never_blocks(tmp_path):
    # A FIFO (like a device) under the given directory would block a read forever: only regular files load.
    shutil.copytree(FIX / "nccl_style", tmp_path / "dumps")
    os.mkfifo(tmp_path / "dumps" / "zz_pipe")
    ts = load_traces([str(tmp_path / "dumps")])
    assert sorted(ts.ranks) == [0, 1, 2, 3] and ts.errors == []


@pytest.mark.parametrize("tweak", ["as_is", "one_record_id_missing", "null_seq", "null_time", "time_beyond_int64",
                                   "negative_time", "zero_times", "no_entries"])
def test_the_scanner_and_the_python_reader_give_one_trace(tmp_path, tweak):
    """A JSON dump read by the C scanner (or handed over by it) and by the Python reader: entry for entry and in
    the per-rank summary, one trace; an integer beyond int64 is refused by both, naming the entry and field."""
    from distdoctor.trace.loaders.flight_recorder import load_fr_json_bytes
    from distdoctor.trace.loaders.fr_reader import Interner
    from distdoctor.trace.summary import _compute

    dump = _as_json_dump(FIX / "nccl_style" / "nccl_trace_rank_1")
    entries = dump["entries"]
    for i, e in enumerate(entries):
        e.pop("frames", None)  # as JSON dumps come (frames are read through the same lists either way)
        for key in ("time_discovered_started_ns", "time_discovered_completed_ns"):  # JSON dumps write 0, not null
            e[key] = e[key] or 1_700_000_000_000_000_000 + 1000 * i
    if tweak == "one_record_id_missing":
        del entries[1]["record_id"]
    elif tweak == "null_seq":
        entries[2]["collective_seq_id"] = None
    elif tweak == "null_time":
        entries[0]["time_created_ns"] = None
    elif tweak == "time_beyond_int64":
        entries[2]["time_discovered_completed_ns"] = 2 ** 63 + 5
    elif tweak == "negative_time":
        entries[0]["time_created_ns"] = -7
    elif tweak == "zero_times":
        for e in entries:
            e["time_discovered_started_ns"] = 0
    elif tweak == "no_entries":
        entries.clear()
    data = json.dumps(dump).encode()
    path = str(tmp_path / "rank_1.json")
    if tweak == "time_beyond_int64":
        for scan in (True, False):
            with pytest.raises(ValueError, match=r"^entry 2 is malformed \(field 'time_discovered_completed_ns': "
                                                 r"ValueError: 9223372036854775813 is beyond a 64-bit integer\)$"):
                load_fr_json_bytes(data, path, Interner(), scan)
        return
    fast = load_fr_json_bytes(data, path, Interner())
    general = load_fr_json_bytes(data, path, Interner(), scan=False)
    assert list(fast.entries) == list(general.entries)
    assert (fast.groups, fast.rank, fast.version) == (general.groups, general.rank, general.version)
    assert _compute(fast) == _compute(general)
    if tweak == "one_record_id_missing":
        assert [e.index for e in fast.entries][:3] == [entries[0]["record_id"], 1, entries[2]["record_id"]]
    elif tweak == "negative_time":
        assert fast.entries[0].t_created == -7 / 1e9


def _as_json_dump(pickled: Path) -> dict:
    dump = safe_unpickle(pickled.read_bytes())
    for e in dump["entries"]:
        e["process_group"] = list(e["process_group"])
    return dump


@pytest.mark.parametrize("tweak", ["as_is", "no_record_id", "float_time", "string_seq", "no_frames"])
def test_json_scanner_and_python_reader_agree(tmp_path, tweak):
    """JSON dumps are read by the C scanner where it can, else by the Python reader (a float time, a string
    seq, frames): both give the same trace, entry for entry (p2p peers, frames, thread names, shared size lists)."""
    from distdoctor.trace.loaders.flight_recorder import load_fr_json_bytes
    from distdoctor.trace.loaders.fr_json_scan import scan_fr_json
    from distdoctor.trace.loaders.fr_reader import Interner

    for r in range(4):
        dump = _as_json_dump(FIX / "nccl_style" / f"nccl_trace_rank_{r}")
        for i, e in enumerate(dump["entries"]):
            if tweak == "no_record_id":
                del e["record_id"]
            elif tweak == "float_time" and i == 0:
                e["time_created_ns"] = float(e["time_created_ns"])
            elif tweak == "string_seq" and i == 0:
                e["collective_seq_id"] = str(e["collective_seq_id"])
            elif tweak == "no_frames":
                e.pop("frames", None)
        data = json.dumps(dump).encode()
        path = str(tmp_path / f"rank_{r}.json")
        fast = load_fr_json_bytes(data, path, Interner())
        general = load_fr_json_bytes(data, path, Interner(), scan=False)
        if tweak in ("float_time", "string_seq"):
            assert scan_fr_json(data) is None  # not an integer where one belongs: the Python reader takes it
        assert list(fast.entries) == list(general.entries)
        assert (fast.groups, fast.rank, fast.version, fast.world_size) == \
               (general.groups, general.rank, general.version, general.world_size)
        loaded = load_file(path if Path(path).write_bytes(data) else path)
        assert list(loaded.entries) == list(general.entries)
    if tweak == "as_is":
        ts = load_traces([str(tmp_path)])
        assert [(f.kind, f.ranks, f.group, f.seq) for f in analyze(ts).findings] == [("state_mismatch", [1], "0", 3)]

