"""`distdoctor lint` on real 4-rank Gloo jobs that completed: the hazard job finds every hazard its evidence can
show (with the ranks, groups and the marked line of train_lint.py among the call sites), its fixed twin and the
healthy real-library jobs (DDP, FSDP2, HSDP, pipelining) find none, in every dump mode.

The jobs run once in the session fixture `real_jobs` (conftest.py, suite.py) beside diagnose's scenarios.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from .suite import LINT_SCENARIOS, command_json

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
HEALTHY = ("ddp_ok", "fsdp_ok", "hsdp_ok", "pp_ok")
MODES = ("recorder", "pickle", "json", "mixed")

# What each dump mode can show of the hazard job (docs/lint.md, "Evidence"): Gloo's Flight Recorder records no
# send/recv and no group creation; its JSON dumps carry no call sites.
VISIBLE = {
    "recorder": {"order_inversion", "rank_conditional_collective", "p2p_order", "group_creation_order"},
    "pickle": {"order_inversion", "rank_conditional_collective"},
    "json": {"order_inversion"},
}
# kind -> (ranks, groups) in lint_hazards: mesh [[0, 1], [2, 3]], 'dp' groups '3' = {0, 2} and '4' = {1, 3}
EXPECTED = {
    "order_inversion": [([0, 2], ["0", "3"]), ([1, 3], ["0", "4"])],
    "rank_conditional_collective": [([0, 1, 2, 3], ["0"])],
    "p2p_order": [([0, 1, 2, 3], ["0"])],
    "group_creation_order": [([0, 1, 2, 3], ["1", "2"])],
}


def lint_json(path: str) -> tuple[int, dict | None, str]:
    return command_json("lint", path)


def marked_lines(kind: str) -> set[str]:
    """'train_lint.py:<n>' of every line marked `# hazard: <kind>`."""
    lines = (HERE / "train_lint.py").read_text().splitlines()
    return {f"train_lint.py:{i}" for i, text in enumerate(lines, 1) if f"# hazard: {kind}" in text}


def _completed(result: dict) -> None:
    job = result["job"] or {}
    assert job.get("ended") == "exited" and job.get("exitcodes") == [0, 0, 0, 0], job


@pytest.mark.parametrize("mode", ("recorder", "pickle", "json"))
def test_hazard_job_shows_every_hazard_its_evidence_can(real_jobs, mode):
    result = real_jobs["lint_hazards"]
    _completed(result)  # the job did not hang: every hazard below is latent
    code, doc, err = lint_json(result["modes"][mode])
    assert doc is not None, err
    assert code == 1 and doc["verdict"] == "hazards"
    got: dict[str, list] = {}
    for h in doc["hazards"]:
        assert set(h) >= {"kind", "ranks", "groups", "sites", "detail"}
        got.setdefault(h["kind"], []).append((h["ranks"], h["groups"]))
    assert set(got) == VISIBLE[mode], doc["hazards"]
    for kind in VISIBLE[mode]:
        assert sorted(got[kind]) == sorted(EXPECTED[kind]), (kind, got[kind])
    if mode == "json":
        return  # no frames in Flight Recorder's JSON dumps: no line to ask for
    for h in doc["hazards"]:
        sites = " ".join(s["site"] for s in h["sites"]) + h["detail"]
        assert any(line in sites for line in marked_lines(h["kind"])), (h["kind"], h["sites"])


def test_hazard_job_in_text_one_sentence_each(real_jobs):
    from distdoctor.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main(["lint", real_jobs["lint_hazards"]["modes"]["recorder"]])
    assert exc.value.code == 1
    text = out.getvalue()
    assert text.startswith("verdict: HAZARDS - 5 hazards")
    for kind in EXPECTED:
        assert f". {kind}: ranks " in text  # diagnose's finding lines: "<n>. <kind>: ranks [...]"


@pytest.mark.parametrize("scenario", (*HEALTHY, "lint_fixed"))
@pytest.mark.parametrize("mode", MODES)
def test_no_hazard_in_healthy_jobs(real_jobs, scenario, mode):
    result = real_jobs[scenario]
    _completed(result)
    code, doc, err = lint_json(result["modes"][mode])
    assert doc is not None, err
    assert (code, doc["verdict"], doc["hazards"]) == (0, "clean", []), doc["hazards"]


def test_recorder_records_group_creations(real_jobs):
    """The evidence group_creation_order needs is there for every rank (and the same on all ranks where the code
    creates groups in one order): hsdp_ok's DeviceMesh, lint_fixed's new_group calls and mesh."""
    for scenario in ("hsdp_ok", "lint_fixed"):
        from distdoctor.trace.loaders import load_traces

        ts = load_traces([real_jobs[scenario]["modes"]["recorder"]])
        made = {r: [(c["api"], c.get("desc"), tuple(c.get("dim_names") or ())) for c in t.group_creations or []]
                for r, t in ts.ranks.items()}
        assert len(made) == 4 and all(made.values()), made
        assert len({tuple(v) for v in made.values()}) == 1, made
        assert any(api == "init_device_mesh" for api, _, _ in made[0]), made[0]


def test_lint_scenarios_are_not_diagnose_scenarios():
    from .suite import SCENARIOS

    assert not set(LINT_SCENARIOS) & set(SCENARIOS)
