"""`distdoctor sim from-trace`: real 4-rank Gloo runs recorded with `distdoctor run --dump-on-exit`, replayed
under the what-if that exposes their latent hang, beside their fixed twins (trace_jobs.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distdoctor.cli import main
from distdoctor.sim.plans.from_trace import load_recorded, replay_program
from distdoctor.sim.plans.trace_pipeline import detect
from distdoctor.sim.result import simulate

JOBS = Path(__file__).parent / "trace_jobs.py"
SCENARIOS = ("latent_hazards", "fixed_twins")
SITES = {m: f"trace_jobs.py:{i}" for i, line in enumerate(JOBS.read_text().splitlines(), 1)
         for m in ("first", "second") if line.endswith(f"# issued: {m}")}
# 6 steps of 3 collectives on 4 ranks; 6 steps of 4 p2p calls on the end stages and 8 on the middle ones; the
# final barrier
CALLS = 6 * 3 * 4 + 6 * (4 + 8 + 8 + 4) + 4
pytestmark = pytest.mark.slow  # real multi-process jobs
DEADLINE_S = 120


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, str]:
    """Every scenario run once, all at once, under `distdoctor run`: {scenario: its recorder dump directory}."""
    out = tmp_path_factory.mktemp("fromtrace")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # tests/conftest.py put this checkout's src/ on PYTHONPATH
    procs = {}
    for name in SCENARIOS:
        d = out / name
        d.mkdir()
        cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(d / "recorder"), "--hang-timeout", "4",
               "--dump-on-exit", "--", sys.executable, str(JOBS), "--out", str(d), "--scenario", name,
               "--stall", "3", "--deadline", "45"]
        procs[name] = subprocess.Popen(cmd, stdout=open(d / "run.out", "w"), stderr=subprocess.STDOUT,
                                       env=env, start_new_session=True)
    deadline = time.monotonic() + DEADLINE_S
    try:
        for name, p in procs.items():
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert rc == 0, f"{name} did not complete on Gloo (rc {rc}):\n{(out / name / 'run.out').read_text()[-3000:]}"
    finally:
        for p in procs.values():
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    return {name: str(out / name / "recorder") for name in SCENARIOS}


def _replay(path: str, **kw):
    rp = replay_program(load_recorded([path]), **kw)
    return rp, simulate(rp.program)


def test_groups_issued_in_opposite_orders_deadlock_on_one_shared_stream(recorded):
    rp, res = _replay(recorded["latent_hazards"])
    assert not res.deadlock  # as it ran: a stream per process group, sends buffered
    assert rp.calls == CALLS and rp.estimated >= 4 * 6 * 2  # async calls take blocking calls' times
    rp, res = _replay(recorded["latent_hazards"], streams="shared")
    assert res.deadlock
    cycle = res.to_json()["cycle"]
    assert {c["rank"] for c in cycle} in ({0, 2}, {0, 3}, {1, 2}, {1, 3})  # one rank of each order
    assert all(c["stream"] == "comm" and c["op"].startswith("all_reduce on ") for c in cycle)
    sentence = res.explanation()[0]
    assert SITES["first"] in sentence and SITES["second"] in sentence  # the user's two call sites
    _, res = _replay(recorded["fixed_twins"], streams="shared")
    assert not res.deadlock


def test_send_first_exchange_deadlocks_with_rendezvous_sends(recorded):
    rp, res = _replay(recorded["latent_hazards"], eager_bytes=0)
    assert res.deadlock
    cycle = res.to_json()["cycle"]
    assert len(cycle) == 2 and {c["op"].split(" (")[0] for c in cycle} == {f"send to {cycle[1]['rank']}",
                                                                           f"send to {cycle[0]['rank']}"}
    assert abs(cycle[0]["rank"] - cycle[1]["rank"]) == 1  # two neighbouring stages, each sending first
    assert all(c["stream"].startswith("p2p ") for c in cycle)
    _, res = _replay(recorded["fixed_twins"], eager_bytes=0)
    assert not res.deadlock
    _, res = _replay(recorded["fixed_twins"], eager_bytes=0, streams="shared")
    assert not res.deadlock
    _, res = _replay(recorded["latent_hazards"], eager_bytes=1 << 20)  # 128-byte messages fit: buffered
    assert not res.deadlock


def test_cli_reports_the_replay_and_the_difference_from_the_recorded_run(recorded, sim_cli, tmp_path, capsys):
    path = recorded["latent_hazards"]
    got = sim_cli("from-trace", path, "--streams", "shared", "--format", "json", "--emit-trace", tmp_path / "tr")
    assert got.returncode == 1, got.stderr
    doc = json.loads(got.stdout)
    assert doc["deadlock"] and doc["cycle"] and doc["explanation"]
    # the what-if's deadlock, written as traces, reads to the doctor as the hang it would be
    with pytest.raises(SystemExit):
        main(["diagnose", str(tmp_path / "tr"), "--format", "json"])
    finding = json.loads(capsys.readouterr().out)["findings"][0]
    assert finding["kind"] == "order_deadlock" and finding["ranks"] == [0, 1, 2, 3]
    ft = doc["from_trace"]
    assert ft["ranks"] == 4 and ft["calls"] == CALLS and ft["recorded_makespan_us"] > 0
    assert ft["simulated_makespan_us"] == doc["makespan_us"]
    assert ft["difference_us"] == pytest.approx(doc["makespan_us"] - ft["recorded_makespan_us"], abs=0.01)
    path = recorded["fixed_twins"]
    got = sim_cli("from-trace", path, "--trials", "8", "--jitter", "0.3", "--eager-bytes", "0")
    assert got.returncode == 0, got.stderr
    assert "8 trials with compute and communication times jittered by up to ±30%" in got.stdout
    assert f"Recorded run: {CALLS} calls" in got.stdout and "of recorded" in got.stdout
    assert "comm 1" in got.stdout and "host MainThread" in got.stdout and "p2p 0 peer 1" in got.stdout
    got = sim_cli("from-trace", path, "--trials", "8", "--format", "json")
    spread = json.loads(got.stdout)["timing"]["makespan_us"]
    assert 0 < spread["min"] <= spread["median"] <= spread["max"]


def test_a_chain_of_stages_is_a_pipeline(recorded):
    shape = detect(replay_program(load_recorded([recorded["fixed_twins"]])))
    assert shape.chains == [[0, 1, 2, 3]] and shape.microbatches == 1


def test_bad_input_is_one_line_exit_2(recorded, tmp_path, capsys):
    cases = {"missing": (tmp_path / "nope", "no such file or directory"),
             "empty": (tmp_path / "empty", "holds no files")}
    (tmp_path / "empty").mkdir()
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "rank_0.jsonl").write_text('{"format": "distdoctor-trace", "version": 1, "rank": 0}\n{"index": 0,\n')
    cases["garbage"] = (garbage, "rank_0.jsonl: line 2 is not JSON")
    partial = tmp_path / "partial"
    shutil.copytree(recorded["fixed_twins"], partial)
    for f in partial.glob("rank_3.*"):
        f.unlink()
    cases["partial"] = (partial, "left no trace")
    cases["scale-pp"] = (recorded["fixed_twins"], "--scale-pp: must be >= 2 stages")
    for name, (path, why) in cases.items():
        args = ["sim", "from-trace", str(path)] + (["--scale-pp", "1"] if name == "scale-pp" else [])
        with pytest.raises(SystemExit) as exc:
            main(args)
        out, err = capsys.readouterr()
        assert exc.value.code == 2 and out == "", (name, out, err)
        assert len(err.strip().splitlines()) == 1 and why in err, (name, err)
