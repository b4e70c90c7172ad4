"""The simulated NCCL world (sim/fr_nccl.py): its dumps look like the real ones field by field, and diagnose
names the planted faults in them. Seeded: each set is reproducible from its seed."""

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from distdoctor.diagnose import analyze
from distdoctor.sim.fr_nccl import Plan, judge, random_plan, write_set
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.loaders.safe_pickle import safe_unpickle

REAL = Path(__file__).parents[1] / "fixtures" / "real-nccl" / "gpu_error_1st"


def _types(obj) -> str:
    return type(obj).__name__


def test_generated_dump_has_the_real_dumps_keys_and_types(tmp_path):
    real = safe_unpickle((REAL / "_dump_12").read_bytes())
    plan = random_plan(random.Random(3))
    plan.fault, plan.faulty = "gpu_stall", [1]
    write_set(tmp_path, plan, 3)
    sim = safe_unpickle((tmp_path / "_dump_0").read_bytes())
    assert set(sim) == set(real)
    assert {k: _types(v) for k, v in sim.items()} == {k: _types(v) for k, v in real.items()}
    assert set(next(iter(sim["pg_status"].values()))) == set(next(iter(real["pg_status"].values())))
    assert set(next(iter(sim["pg_config"].values()))) == set(next(iter(real["pg_config"].values())))
    e_sim, e_real = sim["entries"][0], real["entries"][0]
    assert {k: _types(v) for k, v in e_sim.items()} == {k: _types(v) for k, v in e_real.items()}


def _plans(n: int):
    for seed in range(n):
        plan = random_plan(random.Random(seed))
        plan.active_only = True
        yield pytest.param(seed, plan, id=f"{seed}-{plan.fault}")


def test_a_stop_seen_only_on_p2p_is_hidden_from_active_only_dumps(tmp_path):
    """The known limit (docs/diagnose.md): a GPU that stopped just after finishing its collectives shows it only on
    its pipeline's send/recv, whose completed halves an active-only dump drops. The ground truth says so, and
    diagnose must not blame anyone else first."""
    plan = random_plan(random.Random(75))
    plan.active_only = True
    truth = write_set(tmp_path, plan, 75)
    assert truth.hidden == truth.faulty == [22]
    assert not judge(analyze(load_traces([str(tmp_path)])).findings, truth)


@pytest.mark.parametrize("seed", [75, 86, 278, 336, 357, 372])  # stops an active-only dump hides (above)
def test_a_gpu_stop_seen_only_on_p2p_is_found_in_full_dumps(seed, tmp_path):
    plan = random_plan(random.Random(seed))
    plan.active_only = False
    truth = write_set(tmp_path, plan, seed)
    assert not truth.hidden
    findings = analyze(load_traces([str(tmp_path)])).findings
    assert not judge(findings, truth), [f.to_json() for f in findings[:3]]
    assert findings[0].kind == "gpu_stopped"


@pytest.mark.parametrize("seed,plan", list(_plans(120)))
def test_first_finding_names_only_faulty_ranks_and_every_faulty_rank_is_named(seed, plan, tmp_path):
    """Healthy sets caught mid-flight: no finding. Faulty ones: the first finding names only faulty ranks (or says
    it cannot tell which of its ranks, a faulty one among them), and every faulty rank is named."""
    truth = write_set(tmp_path, plan, seed, "json" if seed % 3 == 0 else "pickle")
    findings = analyze(load_traces([str(tmp_path)], world_size=plan.tp * plan.pp * plan.dp)).findings
    why = judge(findings, truth)
    assert not why, (why, plan, [f.to_json() for f in findings[:3]])


@pytest.mark.parametrize("fault", ["gpu_stall", "healthy"])
def test_a_1024_rank_mesh(fault, tmp_path):
    """Megatron-like TP 8 x PP 8 x DP 16 (EP 8): the stopped GPUs named, and a healthy set caught mid-flight clean."""
    plan = Plan(8, 8, 16, 8, steps=2, micro=2, fault=fault, faulty=[129, 275] if fault != "healthy" else [])
    truth = write_set(tmp_path, plan, seed=1, form="json")
    findings = analyze(load_traces([str(tmp_path)])).findings
    assert not judge(findings, truth), [f.to_json() for f in findings[:3]]
    if fault == "gpu_stall":
        assert findings[0].kind == "gpu_stopped" and findings[0].ranks == [129, 275]


def test_sim_nccl_cli(tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "distdoctor", "sim", "nccl", *args], capture_output=True,
                              text=True, timeout=120, check=False)

    got = cli("--emit-trace", str(tmp_path / "d"), "--fault", "cpu_stall", "--faulty", "3", "--format", "json")
    assert got.returncode == 1, got.stderr
    assert json.loads(got.stdout)["faulty"] == [3] and len(list((tmp_path / "d").glob("_dump_*"))) == 8
    assert cli("--emit-trace", str(tmp_path / "h"), "--trace-format", "fr-nccl-json", "--prefix", "rank_").returncode == 0
    assert json.loads((tmp_path / "h" / "rank_0").read_text())["pg_status"]
    for bad, word in ((["--ep", "3", "--dp", "4"], "--ep"), (["--fault", "p2p_order", "--faulty", "0,1"], "--faulty"),
                      (["--fault", "size", "--faulty", "99"], "--faulty")):
        got = cli("--emit-trace", str(tmp_path / "x"), *bad)
        assert got.returncode == 2 and word in got.stderr and len(got.stderr.strip().splitlines()) == 1, got.stderr
