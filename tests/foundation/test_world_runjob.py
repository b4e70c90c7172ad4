"""run_job in standalone mode, with real worker processes over gloo: results, records, progress, lost ranks."""

import sys
import time

import pytest

from distdoctor.errors import InputError
from distdoctor.world import WorldConfig, run_job

from world_helpers import HERE, children

if HERE not in sys.path:
    sys.path.insert(0, HERE)  # forked workers inherit sys.path: they import world_jobs from here


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_run_job_gathers_every_rank(n, capfd):
    events = []
    result = run_job("world_jobs:sum_ranks", {"scale": 3}, WorldConfig(nproc=n, timeout_s=60), on_event=events.append)
    expected = 3 * sum(range(n))
    assert result.ok and not result.lost and not result.errors
    assert result.world_size == n and result.backend == "gloo" and result.device == "cpu"
    assert result.results == {r: {"rank": r, "world_size": n, "sum": expected, "backend": "gloo"} for r in range(n)}
    assert result.records == {r: [{"rank": r, "sum": expected}] for r in range(n)}
    assert result.iface == "lo"  # loopback rendezvous: gloo binds loopback too
    assert [e for e in events if e["type"] == "progress"] and all(e["rank"] == 0 for e in events)
    out = capfd.readouterr()
    assert "worker chatter" not in out.out and "worker chatter" in out.err  # worker stdout goes to stderr
    assert children() == []


@pytest.mark.slow
@pytest.mark.parametrize("how,reason", [("exit", "exited with code 7"), ("kill", "exited with code -9 (SIGKILL)"),
                                        ("raise", "raised ValueError: planted bug")])
def test_lost_rank_is_named_with_its_collective(how, reason):
    start = time.time()
    result = run_job("world_jobs:lose_rank", {"victim": 2, "how": how}, WorldConfig(nproc=3, timeout_s=20))
    assert not result.ok
    assert [(lr.rank, lr.reason, lr.in_op) for lr in result.lost] == \
        [(2, reason, "all_reduce float32 count=4 group=world step=1")]
    # what every rank computed before the loss is kept, the lost rank's included
    assert all(result.records[r] == [{"step": 0, "rank": r}] for r in range(3))
    assert time.time() - start < 20 + 15
    assert children() == []


@pytest.mark.slow
def test_hung_rank_is_named_and_survivors_stop_within_timeout():
    timeout = 4
    start = time.time()
    result = run_job("world_jobs:lose_rank", {"victim": 0, "how": "hang"}, WorldConfig(nproc=2, timeout_s=timeout))
    elapsed = time.time() - start
    assert not result.ok
    assert len(result.lost) == 1
    lost = result.lost[0]
    assert lost.rank == 0 and lost.reason.startswith("hung: no progress for ")
    assert lost.in_op == "all_reduce float32 count=4 group=world step=1"
    assert "Timed out" in result.errors[1]  # the survivor timed out: a victim, not a cause
    assert elapsed < timeout + 15 + 10  # + start-up of the world on a loaded machine
    assert children() == []


@pytest.mark.slow
def test_rank_hung_after_its_last_collective_is_killed():
    timeout = 3
    result = run_job("world_jobs:hang_at_end", {"victim": 1}, WorldConfig(nproc=2, timeout_s=timeout))
    assert not result.ok
    assert result.results == {0: {"rank": 0}}
    assert [(lr.rank, lr.in_op) for lr in result.lost] == [(1, "post-processing after the last collective")]
    assert result.lost[0].reason.startswith("hung: no progress for ")
    assert children() == []


def test_bad_target_is_an_input_error():
    with pytest.raises(InputError, match="target"):
        run_job("world_jobs", {}, WorldConfig(nproc=2))
    with pytest.raises(InputError, match="cannot load"):
        run_job("world_jobs:no_such_function", {}, WorldConfig(nproc=2))


@pytest.mark.slow
def test_result_that_is_not_json_fails_the_job():
    result = run_job("world_jobs:not_json", {}, WorldConfig(nproc=2, timeout_s=20))
    assert not result.ok and set(result.errors) == {0, 1}
    # each rank fails of its own result, unless the launcher ended it first, once the other had failed (a loaded
    # host: the slower rank is still on its way there); the cause is said at least once
    said = [e for e in result.errors.values() if "JSON serializable" in e]
    assert said and all("JSON serializable" in e or "terminated by the launcher" in e
                        for e in result.errors.values()), result.errors


@pytest.mark.slow
def test_rank_that_hangs_outside_any_collective_is_named_not_its_waiting_peers():
    result = run_job("world_jobs:late_hang", {"victim": 1}, WorldConfig(nproc=3, timeout_s=3))
    assert not result.ok
    assert [(lr.rank, lr.in_op) for lr in result.lost] == [(1, "data loading after a slow start")]
    assert result.lost[0].reason.startswith("hung: ")
    assert set(result.errors) == {0, 2}  # the peers timed out: victims, kept as errors
    assert children() == []


@pytest.mark.slow
def test_a_forked_world_after_the_parent_ran_a_parallel_region_does_not_hang():
    # A notebook computes in its kernel, then starts a world: the forked workers inherit libgomp's pool of a
    # thread they do not have and, without a guard, wait for it forever in their first multi-threaded op.
    from world_helpers import run

    code = ("import torch\nfrom distdoctor.world import WorldConfig, run_job\n"
            "a = torch.randn(512, 512, dtype=torch.float64); (a @ a).sum()\n"
            "res = run_job('world_jobs:matmul_threads', {}, WorldConfig(nproc=2, timeout_s=20))\n"
            "print(res.ok, res.results)\n")
    out = run([sys.executable, "-c", code], timeout=90)  # its own session: nothing outlives a hang
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True {0: 1, 1: 1}"  # one intra-op thread per forked worker
