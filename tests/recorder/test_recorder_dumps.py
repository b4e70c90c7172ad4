"""When the recorder dumps, on real gloo ranks: a hang (with every thread's stack, including a rank stuck in its
data loader), SIGUSR1 while blocked inside a collective, and an uncaught exception."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from distdoctor.trace.code_origin import is_torch, locate
from distdoctor.trace.model import loads

from recorder_helpers import WORKERS, free_port, kill_group

pytestmark = pytest.mark.slow


def read(path):
    try:
        return loads(path.read_text())
    except (OSError, ValueError):
        return None


def names(frames):
    return [f.name for f in frames]


def test_hang_dump_then_sigusr1_while_blocked(ranks_factory, tmp_path, wait_for, cli_env):
    release = tmp_path / "release"
    job = ranks_factory("hang.py", 2, args=[str(release)])
    dumps = tmp_path / "dumps"
    paths = [dumps / "rank_0.jsonl", dumps / "rank_1.jsonl"]
    traces = wait_for(lambda: all(p.exists() for p in paths) and [read(p) for p in paths], 120, "hang dumps")
    for t in traces:
        assert t.dump_reason.startswith("hang: no collective completed"), t.dump_reason
        assert any(n.startswith("prefetcher") for n in t.stacks), list(t.stacks)
        prefetch = next(v for n, v in t.stacks.items() if n.startswith("prefetcher"))
        assert "prefetch_loop" in names(prefetch)
        assert not any(n.startswith("distdoctor-watchdog") for n in t.stacks)
    rank0, rank1 = traces
    main0 = next(v for n, v in rank0.stacks.items() if n.startswith("MainThread"))
    main1 = next(v for n, v in rank1.stacks.items() if n.startswith("MainThread"))
    # rank 1 is in its data loader; rank 0 waits in the second all_reduce, which is recorded as not completed
    # (its innermost own frame: the dump may catch it inside pathlib's exists() under fetch_batch)
    assert [f.name for f in main1 if f.filename.endswith("hang.py")][-1] == "fetch_batch", names(main1)
    assert "fetch_batch" not in names(main0)
    assert not any(locate(f.filename) and locate(f.filename)[0] == "distdoctor" for f in main0)  # our wrapper is cut
    user0 = [f for f in main0 if not is_torch(f.filename)]
    assert user0[-1].name == "<module>" and user0[-1].filename.endswith("hang.py")
    assert [(e.op, e.seq, e.state) for e in rank0.entries] == [("all_reduce", 1, "completed"),
                                                               ("all_reduce", 2, "started")]
    assert [(e.op, e.seq, e.state) for e in rank1.entries] == [("all_reduce", 1, "completed")]
    assert rank0.entries[1].t_completed is None
    # end to end: diagnose names rank 1 as the one that never reached all_reduce #2, and where it is
    report = diagnose_json(dumps, cli_env)
    assert report["verdict"] == "problem" and report["world_size"] == 2
    first = report["findings"][0]
    assert (first["kind"], first["ranks"], first["group"], first["op"], first["seq"]) == \
        ("missing_ranks", [1], "0", "all_reduce", 2)
    assert "fetch_batch" in first["detail"]
    # once per hang: no second hang dump while nothing progresses
    first = paths[0].stat().st_mtime_ns
    time.sleep(1.5)
    assert paths[0].stat().st_mtime_ns == first

    # SIGUSR1 reaches rank 0 although its main thread is blocked inside gloo's all_reduce
    os.kill(job.procs[0].pid, signal.SIGUSR1)
    os.kill(job.procs[1].pid, signal.SIGUSR1)
    for p in paths:
        wait_for(lambda p=p: (read(p) or rank0).dump_reason == "signal: SIGUSR1", 30, f"signal dump {p.name}")
    assert read(paths[0]).entries[-1].state == "started"

    release.touch()
    assert job.wait(timeout=60) == [0, 0]
    # the programs' own SIGUSR1 handlers still ran (rank 0's once its all_reduce returned)
    assert (tmp_path / "usr1_rank0").exists() and (tmp_path / "usr1_rank1").exists()
    final0 = read(paths[0])
    assert final0.dump_reason == "signal: SIGUSR1"  # a clean exit with nothing pending writes no new dump
    assert not list(dumps.glob(".*tmp*")) and not list(dumps.glob(".rank_*.pid"))
    assert (dumps / "rank_0.fr.pkl").exists()


def test_uncaught_exception_dumps_with_its_traceback(ranks_factory, tmp_path, cli_env):
    job = ranks_factory("crash.py", 2)
    codes = job.wait(timeout=120)
    assert codes[1] != 0
    rank1 = read(tmp_path / "dumps" / "rank_1.jsonl")
    assert rank1.dump_reason == "exception: ValueError: bad batch 7"
    exc_stack = rank1.stacks["exception in MainThread"]
    assert names(exc_stack)[-1] == "train_step"
    assert [(e.op, e.seq, e.state) for e in rank1.entries] == [("all_reduce", 1, "completed")]
    assert "ValueError: bad batch 7" in job.output(1)  # the previous excepthook still printed the traceback
    # rank 0 was left in all_reduce #2; gloo fails it when rank 1 dies, and that exception dumps too
    rank0 = read(tmp_path / "dumps" / "rank_0.jsonl")
    if codes[0] != 0:
        assert rank0 is not None and rank0.dump_reason.startswith("exception:")
        last = rank0.entries[-1]
        assert (last.op, last.seq, last.state) == ("all_reduce", 2, "started") and last.error
    # end to end: rank 1 crashed (never reaching all_reduce #2, where rank 0 waits) and is, in its dump, where
    # it raised
    report = diagnose_json(tmp_path / "dumps", cli_env)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"], first["op"], first["seq"]) == ("crashed", [1], "all_reduce", 2)
    assert "train_step" in first["detail"], first["detail"]


def diagnose_json(path, cli_env):
    proc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", str(path), "--format", "json"],
                          capture_output=True, text=True, timeout=120, env=cli_env)
    assert proc.returncode in (0, 1), proc.stderr
    return json.loads(proc.stdout)


def test_exit_with_a_pending_call_dumps(ranks_factory, tmp_path):
    job = ranks_factory("exit_pending.py", 2)
    assert job.wait(timeout=120) == [0, 0]
    rank0 = read(tmp_path / "dumps" / "rank_0.jsonl")
    assert rank0.dump_reason == "exit: process exiting with 1 pending, oldest recv on group 0 peer 1"
    last = rank0.entries[-1]
    assert (last.op, last.peer, last.p2p_seq, last.state, last.async_op) == ("recv", 1, 1, "started", True)
    assert not (tmp_path / "dumps" / "rank_1.jsonl").exists()  # nothing pending there: no dump


def test_sigterm_dumps_then_terminates(ranks_factory, tmp_path, wait_for):
    """What torchrun does to the surviving ranks when one fails: each dumps, then ends as SIGTERM would —
    also rank 0, whose main thread is blocked inside all_reduce."""
    job = ranks_factory("hang.py", 2, env={"HANG_TIMEOUT": "0"}, args=[str(tmp_path / "release")])
    wait_for(lambda: (tmp_path / "ready_rank0").exists() and (tmp_path / "ready_rank1").exists(), 120, "ranks")
    time.sleep(0.5)  # rank 0 is inside all_reduce #2, rank 1 in fetch_batch
    for p in job.procs:
        os.kill(p.pid, signal.SIGTERM)
    codes = job.wait(timeout=60)
    # by the signal itself (the main thread ran the handler) or 143 (the watchdog ended a blocked rank)
    assert all(c in (-signal.SIGTERM, 128 + signal.SIGTERM) for c in codes), codes
    rank0, rank1 = (read(tmp_path / "dumps" / f"rank_{r}.jsonl") for r in (0, 1))
    assert rank0.dump_reason == rank1.dump_reason == "signal: SIGTERM"
    assert [(e.op, e.seq, e.state) for e in rank0.entries][-1] == ("all_reduce", 2, "started")
    assert names(next(v for n, v in rank1.stacks.items() if n.startswith("MainThread")))[-1] == "fetch_batch"


def test_sigterm_while_dumping_an_exception_keeps_the_dump(tmp_path):
    """torchrun stops a rank with SIGTERM when a neighbour failed first — sometimes while this rank is still
    writing the dump of its own exception. The dump must land (with the exception, not replaced by the SIGTERM
    one), and the process must still end as SIGTERM would. (Before: the handler killed the process mid-write
    and the rank had no dump at all, so the innocent rank was reported first as missing.)"""
    dumps = tmp_path / "dumps"
    env = dict(os.environ, DISTDOCTOR_DUMP_DIR=str(dumps))
    proc = subprocess.Popen([sys.executable, str(WORKERS / "exception_sigterm.py"), str(free_port()), "12000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "raising"
        time.sleep(0.1)  # the exception is raised 50 ms after the line: its (large) dump is being written now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
    assert proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), (proc.returncode, err[-2000:])
    trace = read(dumps / "rank_0.jsonl")
    assert trace is not None, os.listdir(dumps)
    assert trace.dump_reason == "exception: ValueError: bad batch 7" and len(trace.entries) == 12000
    assert trace.exception["type"] == "ValueError" and trace.exception["where"].startswith("<module> (")
    assert "ValueError: bad batch 7" in err  # the traceback was still printed before the process ended


def test_exit_with_a_failure_code_dumps_the_code_and_where(ranks_factory, tmp_path):
    """SystemExit passes no excepthook: a rank that leaves with sys.exit(3) mid-job is dumped as one that raised
    SystemExit, with its exit code and the line that chose it, and diagnose reads it as a crash (a cause)."""
    job = ranks_factory("exit_code.py", 2)
    assert job.wait(timeout=120) == [0, 3]
    rank1 = read(tmp_path / "dumps" / "rank_1.jsonl")
    assert rank1.dump_reason == "exception: SystemExit: 3"
    assert rank1.exception["exit_code"] == 3 and rank1.exception["type"] == "SystemExit"
    assert rank1.exception["where"].startswith("give_up (") and "exit_code.py:" in rank1.exception["where"]
    from distdoctor.diagnose.progress import crash_of
    assert crash_of(rank1)["exit_code"] == 3
