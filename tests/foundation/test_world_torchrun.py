"""run_job under a real torchrun: the same worker function, results gathered to rank 0, only rank 0 reports."""

import json
import sys

import pytest

from distdoctor.world import free_port

from world_helpers import HERE, run

JOB = f"{HERE}/world_torchrun_job.py"


def torchrun(func: str, args: dict, timeout_s: float, nproc: int = 2):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), JOB, func, json.dumps(args), str(timeout_s)]
    return run(cmd, timeout=180)


def one_json(stdout: str) -> dict:
    docs = [line for line in stdout.splitlines() if line.strip()]
    assert len(docs) == 1, f"expected one report (rank 0 only), got {len(docs)}:\n{stdout[-2000:]}"
    return json.loads(docs[0])


@pytest.mark.slow
def test_under_torchrun_only_rank_0_reports_everyone():
    out = torchrun("sum_ranks", {"scale": 5}, 30)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = one_json(out.stdout)
    assert doc["mode"] == "launcher" and doc["ok"] and doc["world_size"] == 2 and doc["is_reporter"]
    assert doc["results"] == {str(r): {"rank": r, "world_size": 2, "sum": 5, "backend": "gloo"} for r in range(2)}
    assert doc["records"] == {str(r): [{"rank": r, "sum": 5}] for r in range(2)}
    assert "worker chatter" not in out.stdout
    assert out.leftover == []


@pytest.mark.slow
def test_under_torchrun_loss_of_rank_0_is_reported_by_rank_1():
    out = torchrun("lose_rank", {"victim": 0, "how": "exit"}, 10)
    assert out.returncode != 0
    doc = one_json(out.stdout)
    assert not doc["ok"]
    assert [(lr["rank"], lr["in_op"]) for lr in doc["lost"]] == [(0, "all_reduce float32 count=4 group=world step=1")]
    assert "exited or unreachable" in doc["lost"][0]["reason"]
    assert out.leftover == []  # torchrun and every worker are gone when the command returns


@pytest.mark.slow
def test_a_sigterm_while_a_rank_reports_its_own_error_loses_neither_the_report_nor_the_error():
    """The launcher's SIGTERM can land at any moment after a rank's work ends (torchrun sees the first exit while
    a survivor describes its own error): it must neither end the rank before it reports nor replace the error."""
    out = torchrun("fail_as_launcher_stops", {}, 10, nproc=1)
    assert out.returncode != 0
    doc = one_json(out.stdout)
    assert not doc["ok"]
    assert doc["errors"]["0"].startswith("_SignalledWhileDescribed: planted bug"), doc["errors"]
    assert out.leftover == []


@pytest.mark.slow
def test_under_torchrun_a_hung_rank_is_named_by_rank_0():
    out = torchrun("lose_rank", {"victim": 1, "how": "hang"}, 4)
    assert out.returncode != 0
    doc = one_json(out.stdout)
    assert [(lr["rank"], lr["in_op"]) for lr in doc["lost"]] == [(1, "all_reduce float32 count=4 group=world step=1")]
    assert doc["lost"][0]["reason"].startswith("hung: no progress for ")
    assert doc["wall_s"] < 4 + 15
    assert out.leftover == []


def test_a_rank_lost_between_collectives_is_named_with_the_one_the_survivors_wait_in():
    """A rank cut off between two collectives published no phase: the report names the collective the
    survivors were left waiting in, the one it never joined."""
    from distdoctor import world as W
    from distdoctor.world.blame import name_the_collective_missed

    result = W.JobResult(world_size=4, backend="gloo", device="cpu")
    result.lost = [W.LostRank(2, "host1", "exited or unreachable: no heartbeat for 9 s", None),
                   W.LostRank(3, "host1", "unreachable: never joined", None)]
    name_the_collective_missed(result, {0: "all_reduce 1K", 1: "all_reduce 1K"}, never={3})
    assert result.lost[0].in_op == "all_reduce 1K"
    assert result.lost[1].in_op is None  # never joined: it was in nothing
