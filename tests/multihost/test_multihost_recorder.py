"""A recorded DDP training loop across two hosts (`distdoctor run -- torchrun --nnodes 2 ...`); host1 is lost
mid-training. The survivors' dumps, alone, let `distdoctor diagnose` name the lost ranks; dumps are private."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mh_helpers import Job, scenario, torchrun_argv, wait_for

TRAIN = str(Path(__file__).parent / "workers" / "train_ddp.py")

pytestmark = [pytest.mark.slow, pytest.mark.netns]


@scenario
def recorded_node_lost(cluster, tmp_path, idle) -> SimpleNamespace:
    dumps = {h: tmp_path / f"host{h}" for h in (0, 1)}  # each machine has its own disk
    argv = {h: [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps[h]), "--hang-timeout", "20", "--",
                *torchrun_argv(cluster, h, 2, [TRAIN])] for h in (0, 1)}
    # A plain training script does not pick Gloo's interface itself: the user names it, as on a real cluster.
    job = Job(cluster).start(argv, env={"GLOO_SOCKET_IFNAME": cluster.hosts[0].iface, "TRAIN_TIMEOUT_S": "10"})
    talking = wait_for(lambda: cluster.link_bytes(1) > 3_000_000 or job.results[0].returncode is not None, 180)
    assert talking and job.results[0].returncode is None, job.log()
    t_fault = time.monotonic()
    cluster.kill_host(1)
    idle()
    (host0,) = job.wait(90, hosts=[0])
    stopped_after = job._t0 + host0.elapsed_s - t_fault
    cleaned = wait_for(lambda: cluster.pids(0) == [] and cluster.pids(1) == [], 15)
    return SimpleNamespace(job=job, host0=host0, stopped_after=stopped_after, cleaned=cleaned, dump_dir=dumps[0])


@pytest.mark.scenario("recorded_node_lost")
def test_lost_node_named_from_survivor_dumps(scenarios):
    s = scenarios.result("recorded_node_lost")
    job, host0 = s.job, s.host0
    assert not host0.timed_out and host0.returncode not in (0, None), job.log()
    assert s.stopped_after <= 10 + 15 + 10, job.log()
    assert s.cleaned

    files = sorted(p.name for p in s.dump_dir.iterdir() if not p.name.startswith("."))
    assert "rank_0.jsonl" in files and "rank_1.jsonl" in files and not any("rank_2" in f or "rank_3" in f
                                                                            for f in files), files
    # Owner-only: a dump holds stacks, paths and host names.
    assert stat.S_IMODE(s.dump_dir.stat().st_mode) & 0o077 == 0
    for p in s.dump_dir.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))

    out = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", str(s.dump_dir), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    report = json.loads(out.stdout)
    assert report["verdict"] == "problem" and report["world_size"] == 4
    lost = [f for f in report["findings"] if f["kind"] in ("missing_dump", "missing_ranks")]
    assert lost and lost[0] is report["findings"][0], report["findings"]  # the root cause comes first
    assert sorted({r for f in lost for r in f["ranks"]}) == [2, 3]
