"""One blame policy for both ways of getting a world (world/blame.py), and one reading of what a rank raised
(world/failures.py): the facts a standalone parent and a launcher-side reporter see lead to the same judgement.
The real-process tests (test_world_runjob.py, test_world_torchrun.py, tests/multihost) exercise the same policy
end to end; these pin its rules on the facts alone."""

import pytest

from distdoctor.world.blame import (EXITED, GONE, HUNG, NEVER_STARTED, RUNNING, STOPPED, RankEnd, is_vague,
                                    judge)
from distdoctor.world.failures import is_comm_failure, is_timeout, is_unsupported
from distdoctor.world.result import JobResult

GLOO_TIMEOUT = ("DistBackendError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                "10000ms for recv operation to complete")
GLOO_CLOSED = "DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"


def _judge(ends, world_error=None):
    return judge(ends, JobResult(world_size=len(ends), backend="gloo", device="cpu"), world_error)


def _ok(rank):
    return RankEnd(rank, "h", "all_reduce", outcome={"ok": True, "value": rank})


def _raised(rank, error, phase="all_reduce #3"):
    return RankEnd(rank, "h", phase, outcome={"ok": False, "error": error, "phase": phase})


@pytest.mark.parametrize("text,comm,timeout", [
    (GLOO_TIMEOUT, True, True),
    (GLOO_CLOSED, True, False),
    ("DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:4242: "
     "Connection reset by peer", True, False),
    ("terminate called after throwing an instance of 'gloo::EnforceNotMet'", True, False),
    ("DistBackendError: NCCL communicator was aborted on rank 1.", True, False),
    ("terminated by the launcher (another worker failed)", True, False),
    ("OSError: [Errno 113] No route to host", True, False),
    ("ValueError: bad batch 7", False, False),
    ("ConnectionError: cannot reach the data server", False, False),  # the user's own I/O, not a peer
])
def test_one_reading_of_what_a_rank_raised(text, comm, timeout):
    assert is_comm_failure(text) is comm and is_timeout(text) is timeout
    assert not is_unsupported(text)


def test_unsupported_is_a_fact_about_the_backend():
    assert is_unsupported("RuntimeError: ProcessGroupGloo::allreduce: unsupported reduction AVG for int32")


def test_a_rank_that_raised_on_its_own_is_lost_and_its_victims_are_not():
    result = _judge([_raised(0, GLOO_CLOSED), _raised(1, "ValueError: bad batch 7", "data loading"), _ok(2)])
    assert [(lr.rank, lr.reason, lr.in_op) for lr in result.lost] == [(1, "raised ValueError: bad batch 7",
                                                                      "data loading")]
    assert set(result.errors) == {0, 1} and result.results == {2: 2} and not result.ok


def test_facts_without_an_outcome_are_worded_by_what_was_seen():
    ends = [RankEnd(0, "a", "p0", fate=EXITED, exit_code=-9), RankEnd(1, "b", "p1", fate=HUNG, seconds=63.2),
            RankEnd(2, "c", "p2", fate=GONE, seconds=3.4), RankEnd(3, "d", None, fate=NEVER_STARTED,
                                                                      why="unreachable: never joined")]
    reasons = [(lr.rank, lr.host, lr.reason) for lr in _judge(ends).lost]
    assert reasons == [(0, "a", "exited with code -9 (SIGKILL)"), (1, "b", "hung: no progress for 63 s"),
                       (2, "c", "exited or unreachable: no heartbeat for 3 s"), (3, "d", "unreachable: never joined")]


def test_when_only_victims_are_left_they_are_named_alike_in_both_worlds():
    # standalone: every failing rank saw a communication failure; under a launcher one is still running
    result = _judge([_raised(0, GLOO_TIMEOUT), _raised(1, GLOO_CLOSED), RankEnd(2, "h2", "all_reduce #3",
                                                                                fate=RUNNING)])
    assert [(lr.rank, lr.host, lr.reason.split(":")[0]) for lr in result.lost] == [
        (0, "h", "timed out waiting for peers"), (1, "h", "unreachable"),
        (2, "h2", "still running all_reduce #3 when the report was made")]
    assert all(is_vague(lr.reason) for lr in result.lost[:2])


def test_ranks_that_never_errored_while_every_failing_peer_timed_out_are_hung():
    result = _judge([_raised(0, GLOO_TIMEOUT), RankEnd(1, "h", "post-processing", fate=STOPPED, seconds=70)])
    assert [(lr.rank, lr.reason, lr.in_op) for lr in result.lost] == [(1, "hung: no progress for 70 s",
                                                                      "post-processing")]
    assert 0 in result.errors and not any(lr.rank == 0 for lr in result.lost)


def test_a_rank_lost_between_collectives_is_named_with_the_one_the_survivors_wait_in():
    ends = [_raised(0, GLOO_CLOSED, "all_reduce 1K"), _raised(1, GLOO_CLOSED, "all_reduce 1K"),
            RankEnd(2, "h", None, fate=GONE, seconds=9),
            RankEnd(3, "h", None, fate=NEVER_STARTED, why="never started")]
    lost = {lr.rank: lr for lr in _judge(ends).lost}
    assert lost[2].in_op == "all_reduce 1K" and lost[3].in_op is None  # never started: it was in nothing


def test_a_world_that_never_started_names_rank_0_with_the_start_error():
    result = _judge([RankEnd(0, "h", fate=STOPPED, seconds=0.1), RankEnd(1, "h", fate=STOPPED, seconds=0.1)],
                    world_error="RendezvousTimeoutError: no peers")
    assert [(lr.rank, lr.reason) for lr in result.lost] == [
        (0, "world did not start: RendezvousTimeoutError: no peers")]
