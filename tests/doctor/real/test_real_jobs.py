"""Real 4-rank jobs written with torch's own parallel libraries -> the first finding a correct diagnosis gives.

Each scenario (jobs.py, train_*.py) runs once under `distdoctor run` (conftest.py); its dumps are read in every
mode (suite.py): the recorder's directory, the job's own Flight Recorder pickles, its Flight Recorder JSON
dumps, a seeded per-rank mix of the three, and the report `distdoctor run` printed when the job ended ("run").

The expectations come from the planted bug, not from what distdoctor prints today. Where a mode's evidence
cannot show the cause (Gloo's Flight Recorder records no send/recv and no roots), the expectation is what that
evidence does show, stated in `expected()`. Pairs that are wrong today are listed in KNOWN_WRONG (strict xfail,
with today's wrong answer): delete an entry when a fix makes it pass.
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
    "ddp_crash": ("missing_ranks", [1]),           # rank 1 raised; the others wait in DDP's next broadcast
    "fsdp_crash_midstep": ("missing_ranks", [3]),  # rank 3 raised mid-forward; the others wait in FSDP's all_gather
    "ddp_metric_dtype": ("dtype_mismatch", [2]),   # int32 counters on rank 2, float32 elsewhere
    "ddp_straggler": ("straggler", [3]),           # 150 ms late at every gradient all_reduce
    "fsdp_loader_hang": ("missing_ranks", [1]),    # rank 1 never leaves its data loader
    "dcp_stuck_write": ("missing_ranks", [2]),     # rank 2's checkpoint write never returns
    "dcp_rank0_save": ("missing_dump", [0]),       # Gloo aborts rank 0 on the size mismatch: no dump
    "hsdp_group_order": ("order_deadlock", [0, 1, 2, 3]),
    # rank 0 sits alone in all_reduce #1 of a group no other member ever used; ranks 1-3 wait for it in the
    # default group's next collective: rank 0 is the one that never arrived
    "metrics_group_alone": ("missing_ranks", [0]),
}
# scenario -> rank whose recorder dump holds the exception it died of: the finding must name its type
CRASH = {"ddp_crash": (1, "ValueError"), "fsdp_crash_midstep": (3, "RuntimeError")}
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

# (scenario, mode) -> today's wrong answer. Delete an entry when a fix makes the pair pass (strict xfail fails then).
NO_EXIT_DUMP = "exit 2, 'directory holds no files': no recorder dump at exit after destroy_process_group"
NO_RUN_VERDICT = "'no dumps written', no verdict: no recorder dump at exit after destroy_process_group"
NO_SITE = "right kind and ranks, but no call site of the job's file in the finding"
VOCAB = "at {} #1 on '0': {} (no shared dtype vocabulary)"
KNOWN_WRONG: dict[tuple[str, str], str] = {
    ("ddp_ok", "recorder"): NO_EXIT_DUMP,
    ("ddp_ok", "mixed"): "missing_dump [0, 1] at barrier #16: the ranks drawn 'recorder' have no dump (as above)",
    ("ddp_ok", "run"): NO_RUN_VERDICT,
    ("ddp_crash", "recorder"): "verdict ok, 0 findings: the others fail in DDP's broadcast #6, unseen by the recorder",
    ("ddp_crash", "pickle"): NO_SITE + " (broadcast #6 from train_ddp.py)",
    ("ddp_crash", "mixed"): "type_mismatch [1, 2] at all_gather #1: recorder seq 1 (log all_reduce) vs FR seq 1 (DDP)",
    ("ddp_crash", "run"): "'verdict: OK - 0 findings' printed after rank 1 died of a ValueError",
    ("ddp_metric_dtype", "recorder"): NO_EXIT_DUMP,
    ("ddp_metric_dtype", "pickle"): NO_SITE + " (all_reduce #5 from train_ddp.py)",
    ("ddp_metric_dtype", "mixed"): NO_SITE + "; ranks 1, 3 ('recorder') have no dump",
    ("ddp_metric_dtype", "run"): NO_RUN_VERDICT,
    ("ddp_straggler", "recorder"): NO_EXIT_DUMP,
    ("ddp_straggler", "pickle"): "verdict ok: rank 3 is last at ~10 of 22 collectives (< 60 %); each step's loss "
                                 "all_reduce finds it in step again",
    ("ddp_straggler", "json"): "verdict ok: rank 3 is last at ~10 of 22 collectives (< 60 %); each step's loss "
                               "all_reduce finds it in step again",
    ("ddp_straggler", "mixed"): "missing_dump [3] at barrier #22: rank 3 ('recorder') has no dump",
    ("ddp_straggler", "run"): NO_RUN_VERDICT,
    ("metrics_group_alone", "recorder"): "missing_ranks [1, 2, 3] at all_reduce #1 on '1': blames the innocent "
                                         "majority ('recorded no collective at all': DDP's broadcast #5 is unseen)",
    ("metrics_group_alone", "pickle"): "a hang called OK (some runs: straggler [2]); '1' inferred {0}",
    ("metrics_group_alone", "json"): "a hang called OK (some runs: straggler [2]); '1' inferred {0}",
    ("metrics_group_alone", "mixed"): "order_deadlock [0, 2, 3] on '0', '1': rank 1's recorder trace has no collective",
    ("metrics_group_alone", "run"): "missing_ranks [1, 2, 3] at all_reduce #1 on '1': blames the innocent majority",
    ("fsdp_ok", "recorder"): NO_EXIT_DUMP,
    ("fsdp_ok", "run"): NO_RUN_VERDICT,
    ("fsdp_loader_hang", "pickle"): NO_SITE + " (all_gather #13 from train_fsdp.py)",
    ("fsdp_loader_hang", "mixed"): "dtype_mismatch [1] " + VOCAB.format("all_gather", "'Float' vs 'float32'"),
    ("fsdp_crash_midstep", "recorder"): "missing_ranks [3], 'now at forward': the RuntimeError it died of is not named",
    ("fsdp_crash_midstep", "pickle"): NO_SITE + " (all_gather #16 from train_fsdp.py)",
    ("fsdp_crash_midstep", "mixed"): "dtype_mismatch [1] " + VOCAB.format("all_gather", "'Float' vs 'float32'"),
    ("fsdp_crash_midstep", "run"): "missing_ranks [3], 'now at forward': the RuntimeError it died of is not named",
    ("hsdp_ok", "recorder"): NO_EXIT_DUMP,
    ("hsdp_ok", "mixed"): "size_mismatch [3] at all_gather #1 on '4' 'over 1 ranks': ranks 0-2 have no dump",
    ("hsdp_ok", "run"): NO_RUN_VERDICT,
    ("hsdp_group_order", "recorder"): NO_SITE + " (the cycle names groups and seqs only)",
    ("hsdp_group_order", "pickle"): NO_SITE + " (the cycle names groups and seqs only)",
    ("hsdp_group_order", "mixed"): NO_SITE + " (the cycle names groups and seqs only)",
    ("hsdp_group_order", "run"): NO_SITE + " (the cycle names groups and seqs only)",
    ("dcp_rank0_save", "recorder"): NO_SITE + " ('the survivors got as far as all_gather #13')",
    ("dcp_rank0_save", "pickle"): NO_SITE + " ('the survivors got as far as all_gather #13')",
    ("dcp_rank0_save", "mixed"): "dtype_mismatch [3] " + VOCAB.format("all_gather", "'Float' vs 'float32'"),
    ("dcp_rank0_save", "run"): NO_SITE + " ('the survivors got as far as all_gather #13')",
    ("dcp_stuck_write", "recorder"): "dtype_mismatch [0] at scatter #28: 'uint8' vs root's 'uint8/uint8/uint8/uint8'",
    ("dcp_stuck_write", "pickle"): NO_SITE + " (all_gather #30 from dcp.save, train_fsdp.py)",
    ("dcp_stuck_write", "mixed"): "dtype_mismatch [1] " + VOCAB.format("all_gather", "'Float' vs 'float32'"),
    ("dcp_stuck_write", "run"): "dtype_mismatch [0] at scatter #28: 'uint8' vs the root's 'uint8/uint8/uint8/uint8'",
    ("pp_ok", "recorder"): NO_EXIT_DUMP,
    ("pp_ok", "mixed"): "missing_dump [0] at barrier #3: rank 0 ('recorder') has no dump",
    ("pp_ok", "run"): NO_RUN_VERDICT,
    ("pp_microbatches", "recorder"): NO_SITE + " (the p2p cycle has none)",
    ("pp_microbatches", "pickle"): NO_SITE + " (all_reduce #1 from train_pipeline.py)",
    ("pp_microbatches", "json"): "a hang called OK: ranks 2, 3's dumps have no 'entries', dropped: a 2-rank world",
    ("pp_microbatches", "mixed"): NO_SITE + " (the p2p cycle has none)",
    ("pp_microbatches", "run"): NO_SITE + " (the p2p cycle has none)",
    ("p2p_both_recv", "recorder"): NO_SITE + " (the p2p cycle has none)",
    ("p2p_both_recv", "pickle"): NO_SITE + " (all_reduce #1 from train_pipeline.py)",
    ("p2p_both_recv", "json"): "missing_dump [2, 3]: dumps without 'entries' refused as 'not a trace'",
    ("p2p_both_recv", "mixed"): NO_SITE + " (the p2p cycle has none)",
    ("p2p_both_recv", "run"): NO_SITE + " (the p2p cycle has none)",
    ("object_root", "recorder"): NO_SITE + " (broadcast #1 from train_ddp.py)",
    ("object_root", "pickle"): "a hang called OK: ranks 1, 3 are still in broadcast #1, which ranks 0, 2 completed",
    ("object_root", "json"): "a hang called OK: ranks 1, 3 are still in broadcast #1, which ranks 0, 2 completed",
    ("object_root", "mixed"): "dtype_mismatch [2] " + VOCAB.format("broadcast", "'int64' vs 'Long'"),
    ("object_root", "run"): NO_SITE + " (broadcast #1 from train_ddp.py)",
}


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
