"""`distdoctor run -- CMD`: no code change, dumps appear, exit code passes through; under torchrun too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from distdoctor.trace.model import loads

from recorder_helpers import WORKERS, free_port, kill_group, kill_job_processes


def run_distdoctor(args, timeout, env=None, cwd=None):
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"distdoctor run did not finish in {timeout} s:\n{out[-2000:]}\n{err[-3000:]}")
    return proc.returncode, out, err


def stack(trace, prefix):
    return [f.name for f in next(v for k, v in trace.stacks.items() if k.startswith(prefix))]


@pytest.mark.slow
def test_run_python_script_without_code_change(tmp_path, cli_env):
    dumps = tmp_path / "dumps"
    rc, out, err = run_distdoctor(["--dump-dir", str(dumps), "--hang-timeout", "0", "--",
                                   sys.executable, str(WORKERS / "plain_job.py"), "single", str(free_port())],
                                  timeout=120, env=cli_env)
    assert rc == 3, err  # the script's own exit code
    trace = loads((dumps / "rank_0.jsonl").read_text())
    assert trace.dump_reason == "exception: RuntimeError: loader died"
    assert stack(trace, "exception in loader")[-1] == "loader"
    assert [(e.op, e.group, e.seq, e.state) for e in trace.entries] == [("all_reduce", "0", 1, "completed")]
    assert trace.entries[0].frames[-1].filename.endswith("plain_job.py")
    assert os.stat(dumps).st_mode & 0o777 == 0o700
    assert os.stat(dumps / "rank_0.jsonl").st_mode & 0o777 == 0o600
    assert "rank 0: exception: RuntimeError: loader died" in err
    assert f"next: distdoctor diagnose {dumps}" in err
    assert "command exited with code 3" in err
    assert "Traceback (most recent call last)" in err  # the command's stderr passes through run as it was
    assert not (dumps / "launcher.log").exists()  # a console that is no launcher's log is not kept


@pytest.mark.slow
def test_run_torchrun_two_ranks(tmp_path, cli_env, wait_for):
    """Under torchrun: both ranks dump on the hang (rank 1 stuck in its data loader), SIGUSR1 to `distdoctor run`
    makes every rank dump again (never reaching the agent, which SIGUSR1 would kill), and run reports."""
    dumps, release = tmp_path / "dumps", tmp_path / "release"
    env = dict(cli_env, RELEASE_FILE=str(release), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), "--hang-timeout", "1.5", "--",
         sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
         "--master-port", str(free_port()), str(WORKERS / "plain_job.py"), "torchrun"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, env=env, cwd=tmp_path)
    try:
        def reasons():
            try:
                return [loads((dumps / f"rank_{r}.jsonl").read_text()).dump_reason for r in (0, 1)]
            except (OSError, ValueError):
                return None

        got = wait_for(lambda: (r := reasons()) and all(x.startswith("hang:") for x in r) and r, 150, "hang dumps")
        assert len(got) == 2
        wait_for(lambda: len(list(dumps.glob(".rank_*.pid"))) == 2, 30, "both ranks registered")
        os.kill(proc.pid, signal.SIGUSR1)
        wait_for(lambda: reasons() == ["signal: SIGUSR1"] * 2, 60, "SIGUSR1 dumps of both ranks")
        release.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        kill_group(proc)
        kill_job_processes(dumps)
    assert proc.returncode == 0, err[-3000:]
    assert "SIGUSR1 sent to 2 rank(s)" in err
    # one file per rank; the torchrun agent (which also ran the hook) wrote nothing
    assert sorted(p.name for p in dumps.iterdir()) == ["rank_0.fr.pkl", "rank_0.jsonl", "rank_1.fr.pkl",
                                                       "rank_1.jsonl"]
    rank0, rank1 = (loads((dumps / f"rank_{r}.jsonl").read_text()) for r in (0, 1))
    assert rank0.rank == 0 and rank1.rank == 1 and rank0.world_size == 2
    assert stack(rank1, "MainThread")[-2:] == ["load_next_batch", "sleep"] or \
        stack(rank1, "MainThread")[-1] == "load_next_batch"
    assert [(e.op, e.seq, e.state) for e in rank0.entries][-1] == ("all_reduce", 2, "started")
    assert "2 rank dump(s)" in err and "next: distdoctor diagnose" in err
    # run printed diagnose's report of the dumps: rank 1 never reached all_reduce #2, it was loading data
    print(out)
    assert "verdict: PROBLEM" in out and "missing_ranks: ranks [1] at all_reduce #2" in out, out[-3000:]
    assert "load_next_batch" in out


@pytest.mark.parametrize("args, needle", [
    ([], "command: nothing to run"),
    (["--", "no-such-command-xyz"], "no-such-command-xyz: command not found"),
    (["--buffer", "0", "--", "true"], "--buffer: must be >= 1 calls"),
    (["--hang-timeout", "-1", "--", "true"], "--hang-timeout: must be >= 0"),
    (["--kill-grace", "0", "--", "true"], "--kill-grace: must be a positive number of seconds"),
])
def test_run_bad_input_is_one_line(args, needle, cli_env):
    rc, out, err = run_distdoctor(args, timeout=60, env=cli_env)
    assert rc == 2
    assert err.strip().count("\n") == 0 and needle in err and "Traceback" not in err


def test_run_hook_enables_and_chains_an_existing_sitecustomize(tmp_path, cli_env):
    """The hook enables the recorder in the child without importing torch, then runs the sitecustomize it
    shadows."""
    own = tmp_path / "own"
    own.mkdir()
    marker = tmp_path / "marker"
    (own / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    env = dict(cli_env, PYTHONPATH=os.pathsep.join([str(own), cli_env["PYTHONPATH"]]))
    probe = ("import sys, distdoctor.recorder as t; r = t.get_recorder(); "
             "print(r is not None, r.active, 'torch' in sys.modules, r.config.hang_timeout, r.config.buffer_size)")
    rc, out, err = run_distdoctor(["--dump-dir", str(tmp_path / "d"), "--hang-timeout", "7", "--buffer", "99",
                                   "--", sys.executable, "-c", probe], timeout=60, env=env)
    assert rc == 0, err
    assert out.split() == ["True", "False", "False", "7.0", "99"]  # enabled, dormant, torch not imported
    assert marker.read_text() == "ran"
    assert "no dumps written" in err


def test_run_refuses_a_dump_dir_it_cannot_write(tmp_path, cli_env):
    """Refused at start, in one line, before the job runs: not after a hang, with the dumps lost."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    marker = tmp_path / "ran"
    for bad in (blocker / "dumps", blocker, "/proc/distdoctor-dumps"):
        rc, out, err = run_distdoctor(["--dump-dir", str(bad), "--", sys.executable, "-c",
                                       f"open({str(marker)!r}, 'w')"], timeout=60, env=cli_env)
        assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("distdoctor run: error:") and "--dump-dir" in err and str(bad) in err, err
        assert not marker.exists()


def test_run_leaves_no_hidden_files_and_no_empty_dump_dir(tmp_path, cli_env):
    """A job that dumps nothing leaves no directory behind; pid files of ranks that were killed (no chance to
    remove their own) and the request file are removed when the job ends."""
    dumps = tmp_path / "d"
    rc, _, err = run_distdoctor(["--dump-dir", str(dumps), "--", sys.executable, "-c", "pass"], timeout=60,
                                env=cli_env)
    assert rc == 0 and not dumps.exists(), err
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "rank_0.jsonl").write_text("old dump\n")
    script = (f"import os; d = {str(kept)!r}; "
              "open(os.path.join(d, '.rank_3.pid'), 'w').write('999999999\\n' + os.uname().nodename + '\\n'); "
              "open(os.path.join(d, '.request.json'), 'w').write('{}'); "
              "open(os.path.join(d, '.rank_3.jsonl.tmp-999999999-0'), 'w').write('torn')")
    rc, _, err = run_distdoctor(["--dump-dir", str(kept), "--", sys.executable, "-c", script], timeout=60,
                                env=cli_env)
    assert rc == 0, err
    assert sorted(p.name for p in kept.iterdir()) == ["rank_0.jsonl"]


def test_run_ignores_hang_dumps_of_an_earlier_run(tmp_path):
    """A reused --dump-dir holds an old run's suspected-hang dump: the new run must not take it for a hang now."""
    import json
    import time

    from distdoctor.recorder.run_watch import JobWatch

    old = {"format": "distdoctor-trace", "version": 1, "rank": 0, "world_size": 2, "dump_reason": "hang suspected",
           "dump_time": time.time() - 3600, "hang": {"status": "suspected", "detected_at": time.time() - 3600}}
    (tmp_path / "rank_0.jsonl").write_text(json.dumps(old) + "\n")
    said = []
    watch = JobWatch(str(tmp_path), child=None, kill_on_hang=False, say=said.append,
                     shout=lambda m, nl=True: said.append(m))
    watch.poll()
    assert watch.episode is None and watch.headers == {} and said == []
    new = dict(old, dump_time=time.time(), hang={"status": "suspected", "detected_at": time.time()})
    (tmp_path / "rank_0.jsonl").write_text(json.dumps(new) + "\n")
    watch.poll()  # nobody registered to ask: the episode opens, its verdict waits for the deadline
    assert watch.episode is not None and watch.episode["status"] == "suspected"


def test_one_ranks_resume_does_not_end_another_ranks_hang(tmp_path):
    """Rank 1 reports progress after the episode rank 0 opened; rank 0 then confirms it (its own clock ran the hang
    timeout without progress): the job is hung, and run goes on to the confirmed verdict (a hang it dropped
    left a job that --kill-on-hang never stopped). A rank's report a moment after the resume is the same stall."""
    import time

    from distdoctor.recorder.run_watch import RESUME_RACE_S, JobWatch

    watch = JobWatch(str(tmp_path), child=None, kill_on_hang=False, say=lambda m: None,
                     shout=lambda m, nl=True: None)
    t = time.time()
    opened = {"status": "suspected", "id": "h:1:1", "detected_by": 0, "detected_at": t, "since": t - 2.5}
    watch._consider({"rank": 0, "hang": opened})
    assert watch.episode["status"] == "suspected"
    watch._consider({"rank": 1, "hang": {**opened, "status": "resumed", "resumed_at": t + 0.5}})
    assert watch.episode is None
    watch._consider({"rank": 1, "hang": {"status": "suspected", "detected_at": t + 0.5 + RESUME_RACE_S / 2}})
    assert watch.episode is None  # the same stall, seen a moment before it cleared
    watch._consider({"rank": 0, "hang": {**opened, "status": "confirmed", "confirmed_at": t + 12.0}})
    assert watch.episode is not None and watch.episode["status"] == "confirmed"
    watch.headers[0] = {"rank": 0, "hang": {**opened, "status": "confirmed", "confirmed_at": t + 12.0}}
    assert watch._dumped_for(0, "confirmed") is True
