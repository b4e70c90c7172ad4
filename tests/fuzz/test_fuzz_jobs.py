"""The real-job fuzzer's fixed small sample (fuzz/run_jobs.py; the long run's scoreboard is in docs/diagnose.md):
real programs under `distdoctor run --inject`, each scored in every mode — the live verdict, the closing verdict
and line, diagnose of the recorder's dumps, of Flight Recorder's pickles and of its JSON dumps. An injected run
is right when the first finding names exactly the injected rank with a kind that fits the fault; a healthy run
when no mode has a finding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from distdoctor.world.faults import RUN_KINDS, parse_fault

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))
import run_jobs  # noqa: E402

pytestmark = pytest.mark.slow

CASES = [
    {"program": "ddp", "nproc": 4, "fault": "hang", "spec": "hang:3@step=3", "rank": 3},
    {"program": "objects", "nproc": 4, "fault": "sigterm", "spec": "kill:0:SIGTERM@step=4", "rank": 0},
    {"program": "tp", "nproc": 4, "fault": "sigkill", "spec": "kill:1:SIGKILL@step=3", "rank": 1},
    {"program": "moe", "nproc": 4, "fault": "healthy", "spec": None, "rank": None},
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['program']}-{c['fault']}")
def test_the_first_finding_names_the_injected_rank_in_every_mode(case, tmp_path):
    result = run_jobs.run_one(case, tmp_path, timeout=200)
    assert "error" not in result, result
    if case["spec"]:
        assert result["fired"] == [str(parse_fault(case["spec"], RUN_KINDS))], result
        assert {"closing", "recorder"} <= set(result["modes"]), result
    else:
        assert result["rc"] == 0 and {"closing", "recorder", "fr_pickle", "fr_json"} <= set(result["modes"]), result
    wrong = {m: j for m, j in result["modes"].items() if not (j["ok"] and j.get("line_names_only_it", True))}
    assert not wrong, (wrong, result.get("closing_line"))


P2P_CASES = [
    {"program": "pipeline", "nproc": 4, "fault": "retype", "spec": "retype:0@call=17", "rank": 0},
    {"program": "pipeline", "nproc": 4, "fault": "slow", "spec": "delay:2:0.5@step=1", "rank": 2},
]


@pytest.mark.parametrize("case", P2P_CASES, ids=lambda c: f"{c['program']}-{c['fault']}")
def test_a_pipeline_stage_is_named_from_its_own_sends_and_receives(case, tmp_path):
    """A stage that sent one message of another dtype (Gloo aborts its receiver, which leaves no dump), or one
    slowed before each of its sends and receives: the closing verdict and the recorder's dumps name it (Flight
    Recorder's Gloo dumps hold no send/recv and cannot)."""
    result = run_jobs.run_one(case, tmp_path, timeout=240, thresholds={"suspect_floor": 10.0, "hang_timeout": 30.0})
    assert "error" not in result and result["fired"] == [str(parse_fault(case["spec"], RUN_KINDS))], result
    wrong = {m: result["modes"][m] for m in ("closing", "recorder") if not result["modes"][m]["ok"]}
    assert not wrong, wrong


def test_the_scoreboard_counts_each_mode_per_program_and_fault():
    results = [{"program": "ddp", "fault": "hang", "spec": "hang:1@step=2", "rank": 1, "fired": ["hang:1@step=2"],
                "modes": {"live": {"ok": True, "first": ["missing_ranks", [1]]},
                          "closing": {"ok": True, "first": ["missing_ranks", [1]], "line_names_only_it": False},
                          "recorder": {"ok": True, "first": ["missing_ranks", [0, 1]]}}},
               {"program": "ddp", "fault": "raise", "spec": "raise:2@step=2", "rank": 2, "fired": ["raise:2@step=2"],
                "modes": {"fr_pickle": {"ok": False, "first": ["missing_ranks", [2]]},
                          "recorder": {"ok": False, "first": ["missing_ranks", [2]]}}},
               {"program": "ddp", "fault": "healthy", "spec": None, "modes": {"recorder": {"ok": True}}},
               {"program": "tp", "fault": "hang", "spec": "hang:1@step=2", "fired": [], "modes": {"live": {"ok": True}}}]
    table = run_jobs.scoreboard(results).splitlines()
    assert "| ddp | hang | 1/1 | 0/1 | 0/1 | - | - | - | - | - |" in table  # a closing line naming another rank is wrong
    # Flight Recorder keeps no exception: a rank that raised reads as absent there, and only there
    assert "| ddp | raise | - | - | 0/1 | 1/1 | - | - | - | - |" in table
    assert "| all | healthy | - | - | 1/1 | - | - | - | - | - |" in table
    assert not any(row.startswith("| tp |") for row in table)  # a fault that never fired is not scored


def test_the_scoreboard_counts_undecided_verdicts_apart():
    """Gloo's Flight Recorder dumps of a pipeline hold no call: `undecided` is wrong for an injected run (it names
    nobody) but no false claim, and the table says how many of the wrong ones it was."""
    results = [{"program": "pipeline", "fault": "hang", "spec": "hang:1@step=3", "rank": 1, "fired": ["hang:1@step=3"],
                "modes": {"fr_json": {"ok": False, "first": None, "verdict": "undecided"},
                          "fr_pickle": {"ok": False, "first": None, "verdict": "ok"}}}]
    table = run_jobs.scoreboard(results).splitlines()
    assert "| pipeline | hang | - | - | - | 0/1 | 0/1 (1 undecided) | - | - | - |" in table


def test_the_mixed_mode_judges_a_rank_by_the_form_it_left():
    """A rank that raised reads as absent in Flight Recorder's dumps: in the mixed mode that is right exactly when
    the injected rank's own dump was Flight Recorder's."""
    def run(form):
        return {"program": "ddp", "fault": "raise", "spec": "raise:2@step=2", "rank": 2, "fired": ["raise:2@step=2"],
                "modes": {"mixed": {"ok": False, "first": ["missing_ranks", [2]],
                                    "forms": {"2": form, "1": "recorder"}}}}
    assert "| ddp | raise | - | - | - | - | - | 1/2 |" in run_jobs.scoreboard([run("fr_pickle"), run("recorder")])


def test_the_mixed_mode_takes_each_ranks_forms_in_turn_and_the_next_one_it_left():
    left = {"recorder": {0: "a", 1: "b", 2: "c"}, "fr_pickle": {0: "d", 2: "e"}, "fr_json": {0: "f", 1: "g"}}
    case = {"program": "ddp", "id": "7-1", "rank": 1}
    chosen = run_jobs.mixed_forms(left, case)
    assert set(chosen) == {0, 1, 2} and all(r in left[form] for r, form in chosen.items())
    assert len(set(chosen.values())) > 1  # ranks in turn: the forms meet
    assert run_jobs.mixed_forms(left, case) == chosen  # the same draw every time


def test_the_scoreboard_counts_false_claims_apart():
    """A wrong verdict that names only innocent ranks, or any finding on a healthy run, is a false claim; one that
    names the injected rank with a kind that does not fit is wrong but not false."""
    results = [{"program": "tp", "fault": "sigkill", "spec": "kill:1:SIGKILL@step=3", "rank": 1,
                "fired": ["kill:1:SIGKILL@step=3"],
                "modes": {"recorder": {"ok": False, "first": ["size_mismatch", [0]]},
                          "fr_json": {"ok": False, "first": ["size_mismatch", [1]]}}},
               {"program": "tp", "fault": "healthy", "spec": None, "rank": None,
                "modes": {"recorder": {"ok": False, "first": ["missing_ranks", [2]]}}}]
    table = run_jobs.scoreboard(results).splitlines()
    assert "| tp | sigkill | - | - | 0/1 (1 false) | - | 0/1 | - | - | - |" in table
    assert "| tp | healthy | - | - | 0/1 (1 false) | - | - | - | - | - |" in table
