"""The streaming load (trace/loaders/stream.py) gives the whole-set report, and holds a bounded part of each rank.

Sets are written as the scale benchmark writes them (benchmarks/diagnose_scale.py: a 3-D layout, one rank lost
in its data loader), small enough to load whole too; each is diagnosed both ways and the reports compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from distdoctor.diagnose.analyze import analyze
from distdoctor.report.diagnose_text import fmt_ranges, render_text
from distdoctor.trace.loaders import load_traces, stream
from distdoctor.trace.loaders.stream import SparseEntries

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import diagnose_scale  # noqa: E402


def _reports(path: str, **kw) -> tuple[str, str, object]:
    ts = load_traces([path], **kw)
    report = analyze(ts)
    return json.dumps(report.to_json(), indent=2), render_text(report), ts


def _set(tmp_path: Path, world: int, entries: int) -> Path:
    diagnose_scale.generate(tmp_path, world, entries)
    return tmp_path


@pytest.mark.parametrize("form", ["json", "pickle"])
def test_streamed_report_is_the_whole_sets(tmp_path, form, monkeypatch):
    monkeypatch.setattr(stream, "LONG_MEMBERS", 4)  # the default group's 64 members travel once per worker
    data = _set(tmp_path, 64, 240)
    whole_json, whole_text, whole = _reports(str(data / form), jobs=1)
    for jobs in (2, 1, 1):  # in workers, then twice in this process: each load sends every list again
        json_, text, ts = _reports(str(data / form), jobs=jobs, stream=True)
        assert ts.streamed and not whole.streamed, ts.stream_note
        assert json_ == whole_json and text == whole_text
    kinds = [f["kind"] for f in json.loads(json_)["findings"]]
    assert kinds[0] == "missing_ranks" and json.loads(json_)["findings"][0]["ranks"] == [diagnose_scale.fault_rank(64)]


def test_held_entries_do_not_grow_with_the_buffer(tmp_path):
    """Each rank keeps its tail window and the entries the analysis reads one by one, however long its buffer."""
    held = {}
    for entries in (160, 640):
        data = _set(tmp_path / str(entries), 16, entries)
        ts = load_traces([str(data / "json")], jobs=1, stream=True)
        assert ts.streamed
        sizes = set()
        for t in ts.ranks.values():
            assert isinstance(t.entries, SparseEntries) and len(t.entries) == t.entries.n
            sizes.add(len(t.entries.positions))
        held[entries] = max(sizes)
        assert held[entries] <= stream.WINDOW + 8  # the window, the pending entries, a few size checks
    assert held[640] == held[160]


def test_a_divergence_deep_in_the_buffer_is_loaded_whole(tmp_path):
    """A mismatch far before the tail cannot be proven away: the set is loaded whole, the report is the same."""
    data = _set(tmp_path, 16, 200)
    path = data / "json" / "rank_5.json"
    dump = json.loads(path.read_text())
    dump["entries"][10]["input_dtypes"] = ["Half"]  # rank 5's 11th collective: another dtype
    dump["entries"][10]["output_dtypes"] = ["Half"]
    path.write_text(json.dumps(dump))
    whole_json, whole_text, _ = _reports(str(data / "json"), jobs=1)
    json_, text, ts = _reports(str(data / "json"), jobs=1, stream=True)
    assert not ts.streamed and "differ" in ts.stream_note
    assert json.loads(json_)["findings"][0]["kind"] == "dtype_mismatch"
    assert json_ == whole_json and text == whole_text


def test_reading_a_trimmed_entry_loads_the_rank_whole(tmp_path):
    data = _set(tmp_path, 16, 200)
    whole = load_traces([str(data / "json")], jobs=1)
    ts = load_traces([str(data / "json")], jobs=1, stream=True)
    trimmed = ts.ranks[3].entries
    assert trimmed.positions is not None and 0 not in trimmed.positions
    assert trimmed[0] == whole.ranks[3].entries[0] and trimmed.positions is None
    assert list(trimmed) == list(whole.ranks[3].entries)


def test_checking_a_streamed_set_reads_no_rank_again(tmp_path):
    """Every command checks each trace's numbers (diagnose/command.checked) before the analysis: on a streamed
    set that reads the entries each rank holds (its trimmed ones were checked whole where it was read), so no
    rank's file is read a second time."""
    from distdoctor.diagnose.command import checked

    data = _set(tmp_path, 16, 200)
    ts = checked(load_traces([str(data / "json")], jobs=1, stream=True))
    assert ts.streamed
    assert all(t.entries.positions is not None and 0 not in t.entries.positions for t in ts.ranks.values())


def test_an_impossible_number_in_a_trimmed_entry_is_named(tmp_path):
    """A sequence number out of range far before the tail: the streamed load names the same file, entry and
    value as the whole load (the rank is kept whole instead of trimmed)."""
    from distdoctor.errors import InputError
    from distdoctor.diagnose.command import checked

    data = _set(tmp_path, 16, 200)
    path = data / "json" / "rank_5.json"
    dump = json.loads(path.read_text())
    dump["entries"][10]["collective_seq_id"] = -3
    path.write_text(json.dumps(dump))
    said = []
    for stream_ in (False, True):
        with pytest.raises(InputError) as caught:
            checked(load_traces([str(data / "json")], jobs=1, stream=stream_))
        said.append(str(caught.value))
    assert said[0] == said[1] and "rank_5.json" in said[0] and "entry 10:" in said[0] and "-3" in said[0], said


def test_rank_ranges():
    assert fmt_ranges([5, 0, 1, 2, 3, 7, 8, 9]) == "0-3, 5, 7-9"
    assert fmt_ranges([4]) == "4"
    assert fmt_ranges(range(0, 1024, 8)) == "0-1016 step 8"  # a mesh dimension's ranks
    assert fmt_ranges([0, 2, 9]) == "0, 2, 9"


@pytest.mark.parametrize("change", ["dtype", "frames"])
def test_a_divergence_deep_in_a_pickle_is_loaded_whole(tmp_path, change):
    """Pickles (read in compact form with their stack frames, trace/coded.py): a rank whose 11th collective has
    another dtype, or was called from another line, cannot be proven to agree; the report is the whole set's."""
    import pickle

    data = _set(tmp_path, 16, 200)
    path = data / "pickle" / "rank_5"
    dump = pickle.loads(path.read_bytes())
    entry = dump["entries"][10]
    if change == "dtype":
        entry["input_dtypes"] = entry["output_dtypes"] = ["Half"]
    else:
        entry["frames"] = [dict(entry["frames"][0], line=121)]
    path.write_bytes(pickle.dumps(dump))
    whole_json, whole_text, _ = _reports(str(data / "pickle"), jobs=1)
    json_, text, ts = _reports(str(data / "pickle"), jobs=1, stream=True)
    assert not ts.streamed and "differ" in ts.stream_note
    assert json_ == whole_json and text == whole_text
    if change == "dtype":
        assert json.loads(json_)["findings"][0]["kind"] == "dtype_mismatch"
