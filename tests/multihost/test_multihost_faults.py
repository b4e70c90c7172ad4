"""Two hosts for real (network namespaces on a bridge), `torchrun --nnodes 2 -m distdoctor validate` across
them, and the faults a cluster suffers: a whole node lost mid-collective, a link cut mid-collective.

The fault is injected once the link has carried real collective traffic (validate's 1 MiB calls), so it lands
in the middle of the collectives, not during startup. Outcomes asserted: the surviving host stops within
timeout + 15 s with a non-zero exit, its report names the lost node, its ranks and the collective they were
in, and says unreachable/lost rather than "wrong result"; no process is left on either host.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from mh_helpers import Job, scenario, torchrun_argv, wait_for

TIMEOUT_S = 10
# A few collectives with 1 MiB payloads: enough traffic to know the job is mid-validate when we strike.
VALIDATE = ["-m", "distdoctor", "validate", "--timeout", str(TIMEOUT_S), "--ops", "all_reduce,all_gather,broadcast",
            "--dtypes", "float32,float64", "--sizes", "1,1MiB", "--format", "json"]
TRAFFIC_BYTES = 3_000_000
# Stop bound from the contract (timeout + 15 s), plus the launcher's own teardown on a loaded 2-core machine.
STOP_BOUND_S = TIMEOUT_S + 15 + 10

pytestmark = [pytest.mark.slow, pytest.mark.netns]


def _start(cluster) -> Job:
    job = Job(cluster).start({h: torchrun_argv(cluster, h, 2, VALIDATE) for h in (0, 1)})
    if not wait_for(lambda: cluster.link_bytes(1) > TRAFFIC_BYTES or any(r.returncode is not None
                                                                          for r in job.results), 180):
        job.wait(1)
        pytest.fail("validate never started talking across the hosts\n" + job.log())
    assert all(r.returncode is None for r in job.results), "validate ended before the fault\n" + job.log()
    return job


def _report(res) -> dict:
    assert res.stdout.strip(), f"no report on stdout\n{res.text()}"
    return json.loads(res.stdout)


@scenario
def link_cut(cluster, tmp_path, idle) -> SimpleNamespace:
    job = _start(cluster)
    t_fault = time.monotonic()
    cluster.cut_link(1)
    idle()
    (host0,) = job.wait(STOP_BOUND_S + 60, hosts=[0])
    stopped_after = job._t0 + host0.elapsed_s - t_fault
    # The cut-off host's ranks cannot reach the rendezvous store on host0 either: with the link still down they
    # must give up on the report within the bound, say why, and exit.
    job.wait(STOP_BOUND_S + 90)
    cluster.restore_link(1)
    cleaned = wait_for(lambda: cluster.pids(0) == [] and cluster.pids(1) == [], 15)
    return SimpleNamespace(job=job, host0=host0, host1=job.results[1], stopped_after=stopped_after,
                           cleaned=cleaned, left=(cluster.pids(0), cluster.pids(1)))


@scenario
def node_killed(cluster, tmp_path, idle) -> SimpleNamespace:
    job = _start(cluster)
    t_fault = time.monotonic()
    killed = cluster.kill_host(1)
    left_on_killed = cluster.pids(1)
    idle()
    (host0,) = job.wait(STOP_BOUND_S + 60, hosts=[0])
    stopped_after = job._t0 + host0.elapsed_s - t_fault
    cleaned = wait_for(lambda: cluster.pids(0) == [] and cluster.pids(1) == [], 15)
    return SimpleNamespace(job=job, host0=host0, killed=killed, left_on_killed=left_on_killed,
                           stopped_after=stopped_after, cleaned=cleaned, left=(cluster.pids(0), cluster.pids(1)))


@pytest.mark.scenario("node_killed")
def test_node_killed_mid_validate(scenarios):
    s = scenarios.result("node_killed")
    job, host0 = s.job, s.host0
    assert s.killed and s.left_on_killed == []
    assert not host0.timed_out, job.log()
    assert host0.returncode not in (0, None), job.log()
    assert s.stopped_after <= STOP_BOUND_S, f"survivors took {s.stopped_after:.1f} s\n{job.log()}"

    report = _report(host0)
    assert report["passed"] is False
    lost = {x["rank"]: x for x in report["lost"]}
    assert {2, 3} <= set(lost), report["lost"]
    for r in (2, 3):
        assert lost[r]["host"] == "host1"  # the node, by the name it has
        assert lost[r]["in_op"] and any(op in lost[r]["in_op"] for op in ("all_reduce", "all_gather", "broadcast")), \
            f"{lost[r]}\n{job.log()}"
    assert {2, 3} <= set(report["culprit_ranks"])
    assert not any(r["status"] == "fail" and "wrong" in (r.get("reason") or "") for r in report["results"])
    assert s.cleaned, s.left
    _no_survivor_blamed(lost)


def _no_survivor_blamed(lost: dict) -> None:
    """Ranks 0 and 1 (host0) survived: a survivor still waiting in its collective when the report is made is a
    victim of the lost node, never reported lost itself."""
    extra = {r: x for r, x in lost.items() if r not in (2, 3)}
    assert not extra, f"a surviving rank is reported lost: {extra}"


@pytest.mark.scenario("link_cut")
def test_link_cut_mid_collective(scenarios):
    s = scenarios.result("link_cut")
    job, host0, host1 = s.job, s.host0, s.host1
    assert not host0.timed_out and host0.returncode not in (0, None), job.log()
    assert s.stopped_after <= STOP_BOUND_S, f"survivors took {s.stopped_after:.1f} s\n{job.log()}"

    report = _report(host0)
    lost = {x["rank"]: x for x in report["lost"]}
    assert {2, 3} <= set(lost), report["lost"]
    for r in (2, 3):
        assert lost[r]["host"] == "host1"
        assert "unreachable" in lost[r]["reason"], lost[r]  # peers unreachable, not a wrong result
        assert lost[r]["in_op"]
    assert all(r["status"] != "fail" or "wrong" not in (r.get("reason") or "") for r in report["results"])
    # The cut-off host gave up on the store (link still down), said why and exited; nothing is left anywhere.
    assert not host1.timed_out, "the cut-off host did not stop with its link down\n" + job.log()
    assert host1.returncode != 0
    assert "rendezvous store" in host1.text() and "unreachable" in host1.text(), host1.text()[-3000:]
    assert s.cleaned, s.left
    _no_survivor_blamed(lost)
