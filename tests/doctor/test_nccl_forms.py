"""Every form an NCCL (or XCCL, or Gloo) Flight Recorder dump takes: versions 2.3-2.10 (pg_status and the NCCL
version only in the newer ones), pickle or JSON, active-only, collective timing off (entries stay `scheduled`),
files under any prefix with the rank taken from the name; and NCCL's order semantics."""

import json
import pickle

import pytest

from distdoctor.diagnose import analyze
from distdoctor.lint.analyze import lint
from distdoctor.trace.loaders import load_traces

VERSIONS = ("2.3", "2.4", "2.5", "2.6", "2.7", "2.8", "2.9", "2.10")
GROUPS = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3]}


def _newer(version: str, than: str) -> bool:
    return tuple(map(int, version.split("."))) >= tuple(map(int, than.split(".")))


def _entry(i: int, group: str, seq: int, op: str, prefix: str, version: str, state="scheduled") -> dict:
    e = {"record_id": i, "pg_id": int(group), "process_group": (group, "default_pg" if group == "0" else "TP"),
         "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": seq, "profiling_name": f"{prefix}{op}",
         "time_created_ns": 10**18 + i, "input_sizes": [[8]], "output_sizes": [[8]], "input_dtypes": ["Float"],
         "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": None,
         "time_discovered_completed_ns": None, "retired": state == "completed", "timeout_ms": 600000,
         "is_p2p": False, "thread_id": "1", "thread_name": "pt_main_thread"}
    if not _newer(version, "2.5"):  # older dumps: no thread names, no is_p2p, no p2p counter
        for k in ("thread_id", "thread_name", "is_p2p", "p2p_seq_id"):
            e.pop(k)
    return e


def _dump(rank: int, prefix: str, version: str, stalled: int) -> dict:
    """Each rank ran 4 all_reduces on the world and on its pair, all completed; all but `stalled` enqueued #5 on
    the world (active-only: only it is listed), which waits for `stalled`."""
    mine = [g for g, m in GROUPS.items() if rank in m]
    entries = [] if rank == stalled else [_entry(0, "0", 5, "all_reduce", prefix, version)]
    d = {"version": version, "entries": entries,
         "pg_config": {g: {"name": g, "desc": "default_pg" if g == "0" else "TP", "ranks": str(GROUPS[g])}
                       for g in mine}}
    if _newer(version, "2.5") and prefix != "gloo:":
        d["pg_status"] = {str(i): {"last_enqueued_collective": 4 + (g == "0" and rank != stalled),
                                   "last_started_collective": -1, "last_completed_collective": 4}
                          for i, g in enumerate(mine)}
        d["nccl_version"] = "2.27.3"
    return d


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("prefix", ["nccl:", "xccl:", "gloo:"])
@pytest.mark.parametrize("form,name", [("pickle", "_dump_{}"), ("json", "rank_{}.json"), ("pickle", "fr_trace{}")])
def test_the_stopped_rank_is_named_in_every_form(tmp_path, version, prefix, form, name):
    for r in range(4):
        d = _dump(r, prefix, version, stalled=2)
        path = tmp_path / name.format(r)
        if form == "json":
            d = {**d, "entries": [{**e, "process_group": list(e["process_group"]), "time_discovered_started_ns": 0,
                                   "time_discovered_completed_ns": 0} for e in d["entries"]]}
            if "pg_status" in d:
                d["pg_status"] = {k: {f: str(v) for f, v in st.items()} for k, st in d["pg_status"].items()}
            path.write_text(json.dumps(d))
        else:
            path.write_bytes(pickle.dumps(d))
    ts = load_traces([str(tmp_path)])
    assert sorted(ts.ranks) == [0, 1, 2, 3] and not ts.errors
    first = analyze(ts).findings[0]
    assert first.ranks == [2], first.to_json()
    assert first.kind == ("cpu_stopped" if "pg_status" in _dump(0, prefix, version, 2) else "missing_ranks")


def _crossed(tmp_path, state: str, status: bool) -> None:
    """Ranks 0 and 1 issue all_reduce #1 on groups 'a' and 'b' in opposite CPU orders."""
    for r, order in ((0, "ab"), (1, "ba")):
        entries = [{"record_id": i, "process_group": [g, ""], "collective_seq_id": 1, "p2p_seq_id": 0,
                    "profiling_name": "nccl:all_reduce", "time_created_ns": 10**18 + i, "input_sizes": [[8]],
                    "output_sizes": [[8]], "input_dtypes": ["Float"], "output_dtypes": ["Float"], "state": state,
                    "retired": state == "completed", "is_p2p": False} for i, g in enumerate(order)]
        d = {"version": "2.9", "entries": entries, "nccl_version": "2.27.3",
             "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
                           "1": {"name": "1", "desc": "a", "ranks": "[0, 1]"},
                           "2": {"name": "2", "desc": "b", "ranks": "[0, 1]"}}}
        for e in entries:
            e["process_group"][0] = {"a": "1", "b": "2"}[e["process_group"][0]]
        if status:
            d["pg_status"] = {str(i): {"last_enqueued_collective": 0 if i == 0 else 1, "last_started_collective": -1,
                                       "last_completed_collective": 0} for i in range(3)}
        (tmp_path / f"rank_{r}.json").write_text(json.dumps(d))


@pytest.mark.parametrize("status", [True, False])
def test_opposite_cpu_orders_across_groups_are_no_deadlock_under_nccl(tmp_path, status):
    """Each group has its own stream: both all_reduces run, whatever order the CPUs enqueued them in."""
    _crossed(tmp_path, "scheduled", status)
    report = analyze(load_traces([str(tmp_path)]))
    assert report.findings == [], [f.to_json() for f in report.findings]
    assert {report.ranks[r]["state"] for r in ("0", "1")} == {"in_flight"}


def test_lint_says_what_an_inversion_means_under_nccl(tmp_path):
    _crossed(tmp_path, "completed", True)
    hazards = lint(load_traces([str(tmp_path)])).hazards
    assert [h.kind for h in hazards] == ["order_inversion"]
    assert hazards[0].evidence["nccl"] and "own GPU stream" in hazards[0].detail
