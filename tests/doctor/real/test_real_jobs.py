"""Real 4-rank jobs written with torch's own parallel libraries -> the first finding a correct diagnosis gives.

Each scenario (jobs.py, train_*.py) runs once under `distdoctor run` (conftest.py); its dumps are read in every
mode (suite.py): the recorder's directory, the job's own Flight Recorder pickles, its Flight Recorder JSON
dumps, a seeded per-rank mix of the three, and the report `distdoctor run` printed when the job ended ("run").

The expectations come from the planted bug, not from what distdoctor prints today. Where a mode's evidence
cannot show the cause (Gloo's Flight Recorder records no send/recv and no roots), the expectation is what that
evidence does show, stated in `expected()` (from Flight Recorder's JSON there are no frames, so no line is
asked for). KNOWN_WRONG is empty: every pair is right. `distdoctor run`'s printed verdict must also be what
`diagnose` says of the same dumps.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from .suite import MODES as DUMP_MODES
from .suite import MIXED_SEED, SCENARIOS, WORLD, diagnose_json, mixed_choice

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
MODES = (*DUMP_MODES, "run")

# ---- the answers ------------------------------------------------------------------------------------------------

HEALTHY = ("ddp_ok", "fsdp_ok", "hsdp_ok", "pp_ok")

# scenario -> (kind, culprit ranks) whatever dumps the ranks left
FIRST = {
    "ddp_metric_dtype": ("dtype_mismatch", [2]),   # int32 counters on rank 2, float32 elsewhere
    "ddp_straggler": ("straggler", [3]),           # 150 ms late at every gradient all_reduce
    "fsdp_loader_hang": ("missing_ranks", [1]),    # rank 1 never leaves its data loader
    "dcp_stuck_write": ("missing_ranks", [2]),     # rank 2's checkpoint write never returns
    "dcp_rank0_save": ("missing_dump", [0]),       # Gloo aborts rank 0 on the size mismatch: no dump
    "hsdp_group_order": ("order_deadlock", [0, 1, 2, 3]),
    # Rank 0 sits alone in all_reduce #1 of a metrics group (new_group) that no other member ever used; ranks 1-3
    # wait for it in DDP's next collective on the default group. With the recorder's group members this is a
    # cycle of waits, but not an order swap: ranks 1-3 would never make that call (it is rank-conditional:
    # `if rank == 0`), so `order_deadlock [0-3]` would send the user looking for two calls in the wrong order.
    # Rank 0 is the one that never arrived where the others wait: `missing_ranks [0]`, whose detail says it is
    # blocked alone in a call no other member ever made (waitfor.py, "rank-conditional calls"). From Gloo's Flight
    # Recorder alone (no group members) the answer is the same.
    "metrics_group_alone": ("missing_ranks", [0]),
}
# scenario -> (the rank that raised, its exception). Where that rank's recorder dump is read, its exception
# header shows the crash: `crashed [r]`, naming the exception (sharper than the `missing_ranks [r]` the suite
# first expected). Where only its Flight Recorder dump is read, nothing says it crashed (Flight Recorder keeps no
# exception): it is the rank the others wait for, `missing_ranks [r]`.
CRASH = {"ddp_crash": (1, "ValueError"),           # at step 1; the others wait in DDP's next broadcast
         "fsdp_crash_midstep": (3, "RuntimeError")}  # mid-forward; the others wait in FSDP's next all_gather
P2P = ("pp_microbatches", "p2p_both_recv")  # ranks 2 and 3 deadlock in p2p; ranks 0 and 1 wait in an all_reduce


def expected(scenario: str, views: dict[int, str]) -> tuple[str, list[int]] | None:
    """The first finding (kind, ranks) for the scenario when rank r left the dump `views[r]` ('recorder',
    'pickle' or 'json'); None for a healthy job. Raises ValueError for a mix whose evidence has no single right
    answer (then the seed must change)."""
    if scenario in HEALTHY:
        return None
    if scenario in FIRST:
        return FIRST[scenario]
    recorded = {r for r, v in views.items() if v == "recorder"}
    if scenario in CRASH:
        rank = CRASH[scenario][0]
        return ("crashed" if rank in recorded else "missing_ranks", [rank])
    if scenario in P2P:
        if {2, 3} <= recorded:  # both sides' p2p calls are in the dumps
            return ("p2p_deadlock", [2, 3])
        if not {2, 3} & recorded:  # Flight Recorder under Gloo: 2 and 3 never reach the all_reduce 0 and 1 wait in
            return ("missing_ranks", [2, 3])
        raise ValueError(f"{scenario}: only one side of the p2p deadlock is recorded")
    if scenario == "object_root":
        if 3 in recorded and len(recorded) >= 3:  # roots are recorded: rank 3's (2) against the others' (0)
            return ("root_mismatch", [3])
        if not recorded:  # no roots: ranks 1 and 3 are still in broadcast #1, which ranks 0 and 2 completed
            return ("state_mismatch", [1, 3])
        raise ValueError("object_root: too few recorded roots to outvote rank 3's")
    raise KeyError(scenario)


def views_of(mode: str, scenario: str) -> dict[int, str]:
    if mode == "mixed":
        return mixed_choice(MIXED_SEED, scenario)
    return {r: ("recorder" if mode == "run" else mode) for r in range(WORLD)}


def parted_lines() -> dict[str, set[str]]:
    """scenario -> {'train_x.py:LINE'} for every line marked `# parted: <scenario>[, <scenario>...]`."""
    found: dict[str, set[str]] = {}
    for path in sorted(HERE.glob("train_*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = re.search(r"# parted: ([\w, ]+)$", line)
            for name in (m.group(1).split(",") if m else ()):
                found.setdefault(name.strip(), set()).add(f"{path.name}:{n}")
    return found


PARTED = parted_lines()


def needs_line(mode: str, scenario: str) -> bool:
    """Where the ranks part (a line of the job's own file) must be in the finding when some rank's dump has
    Python frames: the recorder's, or a Flight Recorder pickle (Flight Recorder's JSON has none)."""
    return any(v in ("recorder", "pickle") for v in views_of(mode, scenario).values())


# ---- what is wrong today ----------------------------------------------------------------------------------------

# (scenario, mode) -> today's wrong answer, as a strict xfail. Empty: every pair is right. A pair may be listed only
# where its mode's evidence cannot support the answer, and then its expectation above must say so instead.
KNOWN_WRONG: dict[tuple[str, str], str] = {}


def _params():
    for scenario in SCENARIOS:
        for mode in MODES:
            reason = KNOWN_WRONG.get((scenario, mode))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(scenario, mode, marks=marks, id=f"{scenario}-{mode}")


# ---- the tests ----------------------------------------------------------------------------------------------------

def _run_report(stdout_path: str) -> tuple[str | None, list[int] | None, str]:
    """(kind or 'ok' or None, ranks, findings text) from the last report `distdoctor run` printed."""
    text = Path(stdout_path).read_text(errors="replace")
    at = text.rfind("verdict: ")
    if at < 0:
        return None, None, ""
    report = text[at:].split("where each rank is:")[0]
    if report.startswith("verdict: OK"):
        return "ok", [], report
    m = re.search(r"^1\. (\w+): ranks \[([\d, ]*)\]", report, re.M)
    return (m.group(1), [int(r) for r in m.group(2).split(",") if r.strip()], report) if m else (None, None, report)


@pytest.mark.parametrize("scenario,mode", list(_params()))
def test_first_finding(real_jobs, scenario, mode):
    want = expected(scenario, views_of(mode, scenario))
    result = real_jobs[scenario]
    if mode == "run":
        kind, ranks, text = _run_report(result["stdout"])
        assert kind is not None, "distdoctor run printed no verdict"
        assert (kind, ranks) == (("ok", []) if want is None else want), text[:1500]
    else:
        code, doc, err = diagnose_json(result["modes"][mode])
        assert doc is not None, f"distdoctor diagnose exit {code}: {err.strip()[:500]}"
        if want is None:
            assert (code, doc["verdict"], doc["findings"]) == (0, "ok", []), \
                [f["detail"] for f in doc["findings"]][:2]
            return
        assert (code, doc["verdict"]) == (1, "problem"), f"exit {code}, verdict {doc['verdict']}"
        first = doc["findings"][0]
        assert (first["kind"], first["ranks"]) == want, first["detail"]
        text = first["detail"] + " " + json.dumps(first["evidence"])
    if want is None:
        return
    if needs_line(mode, scenario):
        assert any(site in text for site in PARTED[scenario]), \
            f"none of {sorted(PARTED[scenario])} in the finding: {text[:1200]}"
    if scenario in CRASH and views_of(mode, scenario)[CRASH[scenario][0]] == "recorder":
        assert CRASH[scenario][1] in text, f"the exception is not named: {text[:1200]}"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_run_prints_what_diagnose_says(real_jobs, scenario):
    """The verdict `distdoctor run` printed last is diagnose's verdict on the dumps it left."""
    result = real_jobs[scenario]
    kind, ranks, text = _run_report(result["stdout"])
    code, doc, err = diagnose_json(result["modes"]["recorder"])
    assert doc is not None, err
    first = (doc["findings"][0]["kind"], doc["findings"][0]["ranks"]) if doc["findings"] else ("ok", [])
    assert (kind, ranks) == first, text[:1500]


# What each job must do, whatever distdoctor makes of it: the harness's own check.
PLAN = {
    **{s: "ok" for s in HEALTHY}, "ddp_metric_dtype": "ok", "ddp_straggler": "ok",
    "ddp_crash": "raised", "fsdp_crash_midstep": "raised", "dcp_rank0_save": "aborted",
    **{s: "hang" for s in ("fsdp_loader_hang", "dcp_stuck_write", "hsdp_group_order", "metrics_group_alone",
                           "object_root", "pp_microbatches", "p2p_both_recv")},
}


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_job_ran_as_planned(real_jobs, scenario):
    result = real_jobs[scenario]
    job = result["job"]
    assert job is not None, f"jobs.py wrote no status; distdoctor run exit {result['run_rc']}"
    assert result["leftover"] == [], "processes outlived distdoctor run"
    codes, states = job["exitcodes"], {int(r): (v or {}).get("state") for r, v in job["fr_dumps"].items()}
    plan = PLAN[scenario]
    if plan == "ok":
        assert (codes, result["run_rc"]) == ([0] * WORLD, 0)
        assert set(states.values()) == {"finished"}
    elif plan == "hang":  # every rank dumped for the stall, then the launcher killed them
        assert (job["ended"], codes, set(states.values())) == ("hang", [-9] * WORLD, {"stall"})
        assert {f"rank_{r}.{ext}" for r in range(WORLD) for ext in ("jsonl", "fr.pkl")} <= set(
            os.listdir(result["modes"]["recorder"]))
    elif plan == "raised":  # one rank raised, the others failed in Gloo when it exited
        assert (job["ended"], codes, set(states.values())) == ("exited", [1] * WORLD, {"error"})
        culprit, exc = CRASH[scenario]
        assert job["fr_dumps"][str(culprit)]["reason"].startswith(exc)
    elif plan == "aborted":  # Gloo aborted rank 0 (SIGABRT) on the size mismatch: it dumped nothing
        assert (job["ended"], codes, states[0]) == ("exited", [-6] + [1] * (WORLD - 1), None)
        assert not any(name.startswith(("rank_0.", "fr_rank_0.")) for mode in DUMP_MODES
                       for name in os.listdir(result["modes"][mode]))
    for mode in ("pickle", "json"):  # the job's own Flight Recorder dumps, every rank that could
        ranks = {int(re.search(r"(\d+)\.\w+$", n).group(1)) for n in os.listdir(result["modes"][mode])}
        assert ranks == set(range(WORLD)) - ({0} if plan == "aborted" else set())


def test_mixed_draws_have_one_right_answer():
    for scenario in SCENARIOS:
        expected(scenario, mixed_choice(MIXED_SEED, scenario))  # raises for an ambiguous draw
    assert all(PARTED.get(s) for s in SCENARIOS if s not in HEALTHY), "a scenario has no `# parted:` line"
