"""The simulated NCCL world (sim/fr_nccl.py): its dumps look like the real ones field by field, and diagnose
names the planted faults in them. Seeded: each set is reproducible from its seed."""

import random
from pathlib import Path

import pytest

from distdoctor.diagnose import analyze
from distdoctor.sim.fr_nccl import random_plan, write_set
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.loaders.safe_pickle import safe_unpickle

REAL = Path(__file__).parents[1] / "fixtures" / "real-nccl" / "gpu_error_1st"
# Classes the analysis gets right on every generated set; the others are scored in docs/diagnose.md.
PROVEN = ("cpu_stall", "p2p_order")


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


def _plans(n: int, classes: tuple[str, ...]):
    seed = 0
    while n:
        rng = random.Random(seed)
        plan = random_plan(rng)
        plan.active_only = True
        if plan.fault in classes:
            yield seed, plan
            n -= 1
        seed += 1


@pytest.mark.parametrize("seed,plan", list(_plans(100, PROVEN)), ids=lambda x: str(x) if isinstance(x, int) else "")
def test_first_finding_names_only_faulty_ranks_and_every_faulty_rank_is_named(seed, plan, tmp_path):
    faulty = write_set(tmp_path, plan, seed, "json" if seed % 3 == 0 else "pickle")
    findings = analyze(load_traces([str(tmp_path)], world_size=plan.tp * plan.pp * plan.dp)).findings
    assert findings, plan
    assert set(findings[0].ranks) <= set(faulty), (plan, [f.to_json() for f in findings[:3]])
    assert set(faulty) <= {r for f in findings for r in f.ranks}, (plan, [f.to_json() for f in findings[:3]])
