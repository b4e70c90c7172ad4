"""diagnose on real NCCL Flight Recorder dumps (tests/fixtures/real-nccl: a 16-rank Megatron MoE job, faults
injected on two ranks; README there). The figure: every injected rank named, and the first finding's ranks all
faulty - in the dumps' own form (active-only pickles, timing off) and in the other forms a dump takes."""

import json
import pickle
import re
import shutil
from pathlib import Path

import pytest

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.loaders.safe_pickle import safe_unpickle
from distdoctor.trace.frontier import frontiers, is_async

REAL = Path(__file__).parents[1] / "fixtures" / "real-nccl"
SETS = ("gpu_error_1st", "lock_gil_1st")
KIND = {"GPU_ERROR": "gpu_stopped", "LOCK_GIL": "cpu_stopped"}


def _injected(name: str) -> dict[int, str]:
    text = (REAL / name / "fault_injection.log").read_text()
    return {int(r): kind for r, kind in re.findall(r"Rank (\d+), fault_type: (\w+)", text)}


def _dumps(name: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    for p in (REAL / name).glob("_dump_*"):
        shutil.copy(p, into / p.name)
    return into


def _check(report, injected: dict[int, str]) -> None:
    first = report.findings[0]
    assert set(first.ranks) <= set(injected), first.to_json()
    named = {r for f in report.findings for r in f.ranks}
    assert set(injected) <= named, [f.to_json() for f in report.findings]
    assert first.kind == KIND[next(iter(injected.values()))]


@pytest.mark.parametrize("name", SETS)
def test_real_sets_name_every_injected_rank_and_only_them_first(name):
    injected = _injected(name)
    assert len(injected) == 2
    report = analyze(load_traces([str(REAL / name)]))
    _check(report, injected)
    assert report.findings[0].ranks == sorted(injected)  # both faulty ranks in one finding
    assert not any(f.kind == "order_deadlock" for f in report.findings)  # CPU order across groups is no cycle


def test_gpu_error_evidence_names_group_desc_collective_and_frontiers():
    f = analyze(load_traces([str(REAL / "gpu_error_1st")])).findings[0]
    assert (f.kind, f.group, f.op, f.seq) == ("gpu_stopped", "74", "all_to_all", 20530)
    assert f.evidence["group_desc"] == "EXPERT_MODEL_PARALLEL_GROUP"
    fr = f.evidence["frontiers"]["74"]
    assert fr["12"]["completed"] == fr["14"]["completed"] == 20529
    assert fr["13"]["completed"] == fr["15"]["completed"] == 20536
    assert "EXPERT_MODEL_PARALLEL_GROUP" in f.detail


def test_pg_status_read_and_mapped_to_group_names():
    ts = load_traces([str(REAL / "gpu_error_1st")])
    t = ts.ranks[12]
    assert is_async(t) and t.comm_lib_version == "2.27.3"
    fr = frontiers(t)
    assert (fr["41"].enqueued, fr["41"].completed, fr["41"].source) == (42817, 42805, "pg_status")
    assert fr["43"].space == "p2p"  # a pipeline group's counts are its sends and receives
    assert fr["41"].started is None  # timing off: -1 in the dump


def _as_json(obj: dict) -> dict:
    """What _dump_fr_trace_json writes of the same dump: pg_status values as strings, unknown times 0."""
    out = dict(obj)
    out["pg_status"] = {k: {f: str(v) for f, v in st.items()} for k, st in obj["pg_status"].items()}
    out["entries"] = [{**e, "process_group": list(e["process_group"]),
                       **{k: e[k] or 0 for k in ("time_discovered_started_ns", "time_discovered_completed_ns")}}
                      for e in obj["entries"]]
    return out


@pytest.mark.parametrize("name", SETS)
def test_json_form_and_other_prefixes_give_the_same_verdict(name, tmp_path):
    injected = _injected(name)
    for i, p in enumerate(sorted((REAL / name).glob("_dump_*"))):
        obj = safe_unpickle(p.read_bytes())
        rank = int(p.name.rsplit("_", 1)[1])
        if i % 2:  # half JSON under one prefix, half pickles under another: one set
            (tmp_path / f"nccl_trace_rank_{rank}.json").write_text(json.dumps(_as_json(obj)))
        else:
            (tmp_path / f"fr_{rank}").write_bytes(pickle.dumps(obj))
    report = analyze(load_traces([str(tmp_path)]))
    _check(report, injected)


def test_cpu_stall_with_the_dump_missing(tmp_path):
    """A CPU so stuck its rank writes nothing: the missing dump and the other stopped CPU are both named."""
    d = _dumps("lock_gil_1st", tmp_path / "set")
    (d / "_dump_9").unlink()
    report = analyze(load_traces([str(d)], world_size=16))
    named = {r for f in report.findings for r in f.ranks}
    assert {9, 14} <= named
    assert set(report.findings[0].ranks) <= {9, 14}
