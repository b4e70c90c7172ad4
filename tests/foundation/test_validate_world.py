"""validate on real gloo worlds (2 and 4 ranks): it passes, and every injected fault fails it and names the rank."""

import pytest

from distdoctor.collectives import SPECS
from vb_helpers import run_json

pytestmark = pytest.mark.slow
ROW_FIELDS = {"op", "dtype", "count", "group", "inplace", "max_abs_err", "ranks_agree", "status", "reason"}


def test_four_ranks_with_mesh_subgroups_passes():
    code, rep, err = run_json("validate", "--nproc", 4, "--sizes", "1,33", "--dtypes", "float32",
                              "--timeout", 60)
    assert code == 0, err[-3000:]
    assert rep["passed"] and rep["world_size"] == 4
    assert {"passed", "world_size", "backend", "results"} <= set(rep)
    assert all(ROW_FIELDS <= set(r) for r in rep["results"])
    rows = rep["results"]
    assert {r["group"] for r in rows} == {"world", "shard", "replicate"}
    for group, n in (("world", 4), ("shard", 2), ("replicate", 2)):
        for op in ("broadcast", "reduce", "gather", "scatter"):
            assert {r["root"] for r in rows if r["group"] == group and r["op"] == op} == set(range(n))
        assert {r["op"] for r in rows if r["group"] == group} == set(SPECS)
    assert all(r["status"] == "pass" for r in rows)
    assert all(r["ranks_agree"] for r in rows if r["status"] == "pass" and SPECS[r["op"]].replicated)


def test_corrupt_delay_and_crash_each_name_their_rank():
    """Three faults on three ranks of one world; each is named with its own evidence."""
    code, rep, err = run_json("validate", "--nproc", 4, "--ops", "all_reduce,scatter", "--dtypes", "float32",
                              "--sizes", "1,64", "--redops", "sum,max", "--no-subgroups", "--timeout", 15,
                              "--inject", "corrupt:2", "--inject", "delay:1:0.4", "--inject", "crash:3:9",
                              timeout=300)
    assert code == 1, err[-3000:]
    assert rep["passed"] is False
    assert rep["culprit_ranks"] == [1, 2, 3]
    why = {c["rank"]: " ".join(c["why"]) for c in rep["culprits"]}
    assert "straggler" in why[1] and "wrong result" not in why[1]
    assert "wrong result" in why[2] and "straggler" not in why[2]
    assert "lost" in why[3] and "#9" in why[3]
    (s,) = rep["stragglers"]
    assert s["rank"] == 1 and s["median_late_s"] >= 0.3
    checked = [r for r in rep["results"] if r["max_abs_err"] is not None]
    assert len(checked) == 8, [(r["op"], r["root"], r["count"], r["status"], r["reason"]) for r in rep["results"]]
    for r in checked:  # every output rank 2 holds is wrong, and only rank 2 is blamed for it
        assert r["status"] == "fail" and r["culprit_ranks"] == [2], r
    assert any(lost["rank"] == 3 and lost["in_op"].startswith("#9 ") for lost in rep["lost"])
    assert all(r["status"] != "pass" for r in rep["results"])


def test_skip_names_the_rank_that_skipped():
    code, rep, err = run_json("validate", "--nproc", 2, "--ops", "all_reduce", "--dtypes", "float32", "--sizes",
                              "1,8", "--redops", "sum,max", "--inject", "skip:0:2", "--timeout", 10, timeout=300)
    assert code == 1, err[-3000:]
    assert rep["passed"] is False and rep["culprit_ranks"] == [0]
    assert "skipped #2" in rep["culprits"][0]["why"][0]
