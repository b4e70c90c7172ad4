"""The compiled Flight Recorder JSON scanner reads every dump exactly as the per-entry reader does, or leaves
it to that reader: same entries, groups, header and per-rank summary. Checked on real dumps (written by torch
in the fixtures), on hand-made layouts the scanner must accept, on inputs it must hand over, and on random
dumps with random damage; the scanner is the C one built at install."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distdoctor.trace.loaders import fr_json_scan, load_traces
from distdoctor.trace.coded import Entries
from distdoctor.trace.loaders.flight_recorder import (_from_json_scan, json_loads, load_fr_json, load_fr_json_bytes,
                                                      safe_unpickle)
from distdoctor.trace.loaders.fr_json_scan import kernels, scan_fr_json
from distdoctor.trace.loaders.fr_reader import Interner
from distdoctor.trace.model import RankTrace
from distdoctor.trace.summary import _compute

from compiled_kernels import compiled_kernel

sys.path.insert(0, str(Path(__file__).parents[1] / "fuzz"))
from fuzz_inputs import FR_JSON, FR_JSON_OBJ, damaged_bytes, json_text, mutated_structure  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
PATH = "dump_rank_0.json"


@pytest.fixture(autouse=True)
def kernel(monkeypatch):
    """Each test with the C scanner."""
    yield from compiled_kernel(monkeypatch, fr_json_scan, "_fr_json_kernel")


def read(data: bytes, scan: bool):
    try:
        return load_fr_json_bytes(data, PATH, Interner(), scan)
    except ValueError as exc:  # a file the readers refuse: the same reason from both
        return f"ValueError: {exc}"


def as_dicts(data: bytes):
    """The Python reader on the dump parsed into dicts (not decoded into fr_reader.STRICT records)."""
    try:
        obj = json_loads(data)
    except (ValueError, RecursionError):
        return None
    try:
        return load_fr_json(obj, PATH, Interner()) if isinstance(obj, dict) and "version" in obj else None
    except ValueError as exc:
        return f"ValueError: {exc}"


def same_reading(data: bytes) -> bool:
    """Assert that the readers agree on `data` (the C scanner, the Python reader's strict decoding, its dicts);
    True when the scanner itself read it."""
    scanned, plain = read(data, True), read(data, False)
    dicts = as_dicts(data)
    if hasattr(plain, "entries") and hasattr(dicts, "entries"):
        assert list(plain.entries) == list(dicts.entries) and plain.groups == dicts.groups
    elif dicts is not None and isinstance(plain, str) and plain.startswith("ValueError: entry"):
        assert plain == dicts
    if not hasattr(plain, "entries"):
        assert scanned == plain
        return False
    assert list(scanned.entries) == list(plain.entries)
    assert (scanned.groups, scanned.rank, scanned.version, scanned.world_size) == \
           (plain.groups, plain.rank, plain.version, plain.world_size)
    assert list(scanned.groups) == list(plain.groups)  # in the same order, too
    found = scan_fr_json(data)  # both readers give the same form: ask the scanner whether it reads this one
    used = found is not None and _from_json_scan(found, PATH, Interner()) is not None
    summary = _compute(scanned)
    assert summary == _compute(plain) == _compute(RankTrace(0, "native", entries=list(plain.entries)))
    return used


def entry(i: int, group: str = "0", op: str = "nccl:all_reduce", **extra) -> dict:
    e = {"record_id": i, "pg_id": 0, "process_group": [group, "default_pg" if group == "0" else group],
         "collective_seq_id": i + 1, "p2p_seq_id": 0, "op_id": i + 1, "profiling_name": op,
         "time_created_ns": 1_700_000_000_000_000_000 + i * 1000, "input_sizes": [[4096, 1024]],
         "input_dtypes": ["Float"], "output_sizes": [[4096, 1024]], "output_dtypes": ["Float"],
         "state": "completed", "time_discovered_started_ns": 1_700_000_000_000_000_500 + i * 1000,
         "time_discovered_completed_ns": 1_700_000_000_000_000_900 + i * 1000, "retired": True,
         "timeout_ms": 600000, "is_p2p": False, "thread_id": "140", "thread_name": "pt_main_thread"}
    e.update(extra)
    return e


def dump(entries: list[dict], **header) -> dict:
    d = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
                                           "tp": {"name": "tp", "desc": "tp", "ranks": "[0, 1]"}},
         "pg_status": {}, "entries": entries}
    d.update(header)
    return d


def mixed_entries(n: int = 12) -> list[dict]:
    """Collectives on two groups, an all_gather, p2p both ways, a pending tail, a repeated seq, a zero time."""
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append(entry(i))
        elif kind == 1:
            out.append(entry(i, "tp", "nccl:all_gather", input_sizes=[[8]], output_sizes=[[16]]))
        elif kind == 2:
            out.append(entry(i, "tp", "nccl:send 0->1", is_p2p=True, p2p_seq_id=i, collective_seq_id=0))
        else:
            out.append(entry(i, "tp", "nccl:recv 0<-1", is_p2p=True, p2p_seq_id=i, collective_seq_id=0))
    out[-1].update(state="started", retired=False, time_discovered_completed_ns=None)
    out[-2].update(state="scheduled", retired=False, time_discovered_started_ns=0)
    out.append(entry(0))  # seq 1 again: the last one counts
    return out


def test_the_scanner_is_available(kernel):
    scan = kernels()
    assert scan is not None and (scan.__module__ or "").endswith("_fr_json_kernel")


@pytest.mark.parametrize("layout", ["default", "indented", "compact", "keys_shuffled", "fields_missing",
                                    "no_record_id", "unicode", "unknown_nested", "empty", "small_entries",
                                    "many_unknown_fields"])
def test_layouts_the_scanner_reads(layout):
    entries = mixed_entries()
    kwargs: dict = {}
    if layout == "indented":
        kwargs = {"indent": 2}
    elif layout == "compact":
        kwargs = {"separators": (",", ":")}
    elif layout == "keys_shuffled":
        rng = random.Random(0)
        entries = [dict(rng.sample(list(e.items()), len(e))) for e in entries]
    elif layout == "fields_missing":
        for i, e in enumerate(entries):
            for key in ("thread_name", "time_discovered_started_ns", "output_dtypes", "is_p2p")[: i % 5]:
                e.pop(key, None)
    elif layout == "no_record_id":
        for e in entries:
            del e["record_id"]
    elif layout == "unicode":
        kwargs = {"ensure_ascii": False}  # UTF-8 as is, as torch writes it (an escape hands the file over)
        for e in entries:
            e["thread_name"] = "trainer-→-µ"
    elif layout == "unknown_nested":
        for i, e in enumerate(entries):
            e["collective_stats"] = {"bytes": [i, {"x": None, "y": [True, False, -1.5e3]}], "s": "a:{b}"}
            e["timeout_ms"] = float("1e300") if i % 2 else -0.5
    elif layout == "empty":
        entries = []
    elif layout == "many_unknown_fields":  # a replay program too long to keep: those entries are scanned whole
        entries = [dict(e, **{f"extra_{k}": k for k in range(40)}) for e in entries]
    elif layout == "small_entries":  # more entries than the first guess at how many fit in the file
        entries = [{"process_group": ["0", ""], "profiling_name": "x"} for _ in range(400)]
    data = json.dumps(dump(entries), **kwargs).encode()
    assert same_reading(data)


@pytest.mark.parametrize("case", ["backslash", "key_twice", "float_seq", "negative_time", "string_seq",
                                  "null_record_id", "beyond_int64", "frames", "trailing_comma", "control_char",
                                  "not_an_object", "entries_twice", "leading_zero",
                                  "garbage_after", "empty_process_group", "old_version"])
def test_inputs_the_scanner_hands_over(case):
    """Each makes the scanner give up (the per-entry reader, or the general path, then decides)."""
    entries = mixed_entries()
    text = None
    if case == "backslash":
        entries[3]["thread_name"] = 'a "quoted" name'
    elif case == "float_seq":
        entries[2]["collective_seq_id"] = 3.0
    elif case == "negative_time":
        entries[5]["time_created_ns"] = -5
    elif case == "string_seq":
        entries[1]["collective_seq_id"] = "7"
    elif case == "null_record_id":
        entries[4]["record_id"] = None
    elif case == "beyond_int64":
        entries[6]["time_created_ns"] = 2 ** 63
    elif case == "frames":
        entries[0]["frames"] = [{"name": "f", "filename": "a.py", "line": 3}]
    elif case == "empty_process_group":
        entries[2]["process_group"] = []
    text = json.dumps(dump(entries, version="1.0" if case == "old_version" else "2.10"))
    if case == "key_twice":
        text = text.replace('"state": "completed"', '"state": "completed", "state": "started"', 1)
    elif case == "trailing_comma":
        text = text.replace('"Float"]', '"Float"],]', 1)
    elif case == "control_char":
        text = text.replace("pt_main_thread", "pt_main\x01thread", 1)
    elif case == "not_an_object":
        text = text.replace('"entries": [', '"entries": [1, ', 1)
    elif case == "entries_twice":
        text = text[:-1] + ', "entries": []}'
    elif case == "leading_zero":
        text = text.replace('"timeout_ms": 600000', '"timeout_ms": 0600000', 1)
    elif case == "garbage_after":
        text += " x"
    data = text.encode()
    assert scan_fr_json(data) is None or case in ("empty_process_group", "old_version", "frames")
    assert not same_reading(data)


# Entries that repeat an earlier one but for their integers are read by replaying its bytes (fr_json_kernels.replay):
# a late entry that departs from its group's first one anywhere must be read byte by byte, or handed over, exactly
# as if nothing had been replayed.
LATE_CHANGES = {
    "whitespace": (lambda t: t.replace('"state": "completed", "time_discovered_started_ns": 1700000000000030500',
                                       '"state":"completed" ,"time_discovered_started_ns":1700000000000030500'), True),
    "extra_key": (lambda t: t.replace('"record_id": 30,', '"record_id": 30, "extra": [1, {"a": null}],'), True),
    "missing_key": (lambda t: t.replace('"record_id": 30, "pg_id": 0,', '"record_id": 30,'), True),
    "null_time": (lambda t: t.replace('1700000000000030500', 'null'), True),
    "longer_ints": (lambda t: t.replace('"record_id": 30,', '"record_id": 30000000000,'), True),
    "new_group": (lambda t: t.replace('"record_id": 30, "pg_id": 0, "process_group": ["tp", "tp"]',
                                      '"record_id": 30, "pg_id": 0, "process_group": ["9", "tp"]'), True),
    "float_own": (lambda t: t.replace('"record_id": 30,', '"record_id": 30.0,'), False),
    "negative_own": (lambda t: t.replace('"collective_seq_id": 31,', '"collective_seq_id": -31,'), False),
    "leading_zero_unread": (lambda t: t.replace('"record_id": 30, "pg_id": 0,', '"record_id": 30, "pg_id": 00,'),
                            False),
    "bad_unread": (lambda t: t.replace('"record_id": 30, "pg_id": 0,', '"record_id": 30, "pg_id": [1,],'), False),
    "control_char_unread": (lambda t: t.replace('"op_id": 31,', '"op_id": "a\x01b",'), False),
    "escape_unread": (lambda t: t.replace('"op_id": 31,', '"op_id": "a\\"b",'), False),
    "cut_in_late_entry": (lambda t: t[:t.index('"record_id": 30,') + 40], False),
}


@pytest.mark.parametrize("case", sorted(LATE_CHANGES))
def test_a_late_entry_that_departs_from_its_group(case):
    entries = [entry(i, "0" if i % 3 else "tp", "nccl:all_reduce" if i % 2 else "nccl:broadcast")
               for i in range(40)]
    text = json.dumps(dump(entries))
    change, scanned = LATE_CHANGES[case]
    changed = change(text)
    assert changed != text
    assert same_reading(changed.encode()) is scanned


def test_real_dumps_with_and_without_frames(tmp_path):
    """torch's own dumps (frames and all) go to the per-entry reader; without frames the scanner reads them."""
    for r in range(4):
        obj = safe_unpickle((FIX / "nccl_style" / f"nccl_trace_rank_{r}").read_bytes())
        for e in obj["entries"]:
            e["process_group"] = list(e["process_group"])
        assert not same_reading(json.dumps(obj).encode())
        for e in obj["entries"]:
            e.pop("frames", None)
        assert same_reading(json.dumps(obj).encode())


def test_a_big_set_loads_in_parallel_through_the_scanner(tmp_path):
    """64 files: the parallel loader scans them, sends them coded, and gives the traces a serial load gives."""
    for r in range(64):
        entries = mixed_entries(8)
        if r == 5:
            entries = entries[:5]  # rank 5 stops early
        (tmp_path / f"rank_{r}.json").write_text(json.dumps(dump(entries, rank=r)))
    parallel = load_traces([str(tmp_path)], jobs=2)
    serial = load_traces([str(tmp_path)], jobs=1)
    assert sorted(parallel.ranks) == list(range(64)) and not parallel.errors
    for r, trace in parallel.ranks.items():
        assert scan_fr_json((tmp_path / f"rank_{r}.json").read_bytes()) is not None  # read by the scanner
        assert list(trace.entries) == list(serial.ranks[r].entries)
        assert trace.summary == _compute(serial.ranks[r])


def test_one_file_is_read_by_the_scanner_too(tmp_path, monkeypatch):
    """The compiled readers read every load, however few files: one dump alone goes through the scanner."""
    from distdoctor.trace.loaders import _fr_json_kernel as k

    calls = []
    scan = k.scan
    monkeypatch.setattr(k, "scan", lambda *arrays: calls.append(1) or scan(*arrays))
    kernels.cache_clear()
    (tmp_path / "rank_0.json").write_text(json.dumps(dump(mixed_entries(8), rank=0)))
    ts = load_traces([str(tmp_path)])
    assert list(ts.ranks) == [0] and isinstance(ts.ranks[0].entries, Entries)
    assert len(calls) >= 2  # the start-up check, then the dump


def test_without_the_c_readers_the_set_loads_and_stderr_says_so_once(tmp_path, monkeypatch, capsys):
    """An install without a C compiler: the Python reader loads every dump, and the first load says once on
    stderr that the compiled readers are missing and what that costs."""
    from distdoctor.trace.loaders import fr_pickle_scan

    for name in ("_fr_json_kernel", "_fr_pickle_kernel"):  # an import of None raises ImportError
        monkeypatch.setitem(sys.modules, f"distdoctor.trace.loaders.{name}", None)
    monkeypatch.setattr(fr_json_scan, "_noted_missing", False)
    kernels.cache_clear()
    fr_pickle_scan.kernels.cache_clear()
    try:
        for r in range(2):
            (tmp_path / f"rank_{r}.json").write_text(json.dumps(dump(mixed_entries(8), rank=r)))
        (tmp_path / "rank_2.pkl").write_bytes(__import__("pickle").dumps(dump(mixed_entries(8), rank=2), protocol=4))
        first = load_traces([str(tmp_path)])
        again = load_traces([str(tmp_path)])
        assert sorted(first.ranks) == sorted(again.ranks) == [0, 1, 2] and not first.errors
        err = capsys.readouterr().err
        assert err.count("compiled Flight Recorder readers were not built") == 1 and "the CPU time" in err
    finally:
        monkeypatch.undo()
        fr_pickle_scan.kernels.cache_clear()
        kernels.cache_clear()


_values = st.one_of(st.none(), st.booleans(), st.integers(-3, 2 ** 64), st.floats(allow_nan=False),
                    st.text(max_size=6), st.lists(st.integers(0, 9), max_size=3))


@st.composite
def random_dumps(draw) -> bytes:
    """Dumps the scanner is meant for, with random values in random fields, random layout and random damage."""
    entries = mixed_entries(draw(st.integers(2, 9)))[:draw(st.integers(0, 10))]
    for e in entries:
        for key in draw(st.lists(st.sampled_from(sorted(e)), max_size=2)):
            if draw(st.booleans()):
                e[key] = draw(_values)
            else:
                e.pop(key, None)
    text = json.dumps(dump(entries), indent=draw(st.sampled_from([None, 1])),
                      sort_keys=draw(st.booleans())).encode()
    damage = draw(st.sampled_from(["none", "flip", "cut", "insert"]))
    if damage != "none" and text:
        at = draw(st.integers(0, len(text) - 1))
        if damage == "flip":
            text = text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1:]
        elif damage == "cut":
            text = text[:at]
        else:
            text = text[:at] + draw(st.sampled_from([b",", b"]", b"{", b'"', b"\\", b" ", b"-", b"0"])) + text[at:]
    return text


def test_a_byte_that_is_not_utf8_in_a_key_the_scanner_skips_reads_as_the_per_entry_reader_reads_it():
    """Found by the random dumps below (tests/doctor/fixtures/not_utf8/key_rank_0.json: a damaged byte, 0x80,
    in an entry's key): the scanner skipped the key and read the dump, the per-entry reader refused it as
    corrupt. Text that is not UTF-8 is now refused by both."""
    data = (Path(__file__).parent / "fixtures" / "not_utf8" / "key_rank_0.json").read_bytes()
    assert same_reading(data) is False
    assert isinstance(read(data, True), str) and "UTF-8" in read(data, True)


# No deadline or speed check: the machine is shared and noisy (as in tests/fuzz).
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(random_dumps())
def test_random_dumps_read_the_same(data):
    same_reading(data)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(st.one_of(mutated_structure(FR_JSON_OBJ, allow_bytes=False).map(json_text), damaged_bytes(FR_JSON.encode())))
def test_mutated_real_json_dumps_read_the_same(text):
    """The fuzz targets' mutations of a JSON dump written by torch (tests/fuzz)."""
    if text is not None:
        same_reading(text.encode() if isinstance(text, str) else text)


def test_a_scanner_that_cannot_start_is_named_and_the_dumps_still_load(tmp_path, monkeypatch, capsys, kernel):
    """A scanner there but unable to run (built for another machine, say): the per-entry reader loads the set and
    the CLI says why."""
    from distdoctor.trace.loaders import _fr_json_kernel as k

    def broken(*args):
        raise RuntimeError("no LLVM target for this machine")

    monkeypatch.setattr(k, "scan", broken)
    kernels.cache_clear()
    try:
        for r in range(64):
            (tmp_path / f"rank_{r}.json").write_text(json.dumps(dump(mixed_entries(4), rank=r)))
        assert kernels() is None and "no LLVM target" in fr_json_scan.FAILURE
        assert sorted(load_traces([str(tmp_path)]).ranks) == list(range(64))
        from distdoctor.cli import main

        with pytest.raises(SystemExit):
            main(["diagnose", str(tmp_path), "--format", "json"])
        out, err = capsys.readouterr()
        assert json.loads(out)["world_size"] == 64
        assert "the compiled JSON scanner could not start (RuntimeError: no LLVM target" in err
    finally:
        monkeypatch.undo()
        kernels.cache_clear()
        fr_json_scan.FAILURE = None
    assert kernels() is not None  # (the environment is back as it was: the C scanner where built)


def test_the_c_scanner_refuses_arrays_that_do_not_fit(kernel):
    """The C kernel checks every array it is given: a caller's mistake is an error, never a write out of bounds."""
    import numpy as np

    from distdoctor.trace.loaders._fr_json_kernel import scan

    calls = []
    text = json.dumps(dump([entry(0), entry(1)])).encode()
    fr_json_scan._scan_with(lambda *arrays: calls.append(arrays) or scan(*arrays), text)
    arrays = list(calls[0])
    assert scan(*arrays) == 2
    for k, wrong in ((11, arrays[11][:1]), (6, arrays[6].astype(np.int32)), (13, arrays[13][:10]), (5, arrays[5].T)):
        bad = arrays.copy()
        bad[k] = wrong
        with pytest.raises(ValueError):
            scan(*bad)
    with pytest.raises(TypeError):
        scan(*arrays[:19])
