"""`distdoctor run --inject KIND:RANK[:ARG][@WHEN]`: faults planted at the torch.distributed boundary of real gloo
ranks. The grammar is validate's (one parser); each kind does to the named rank's call what it says, the recorder
records what the rank really did, and the truth is written beside the dumps."""

from __future__ import annotations

import json
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from distdoctor.diagnose.progress import outside_torch
from distdoctor.errors import InputError
from distdoctor.trace.model import loads
from distdoctor.world.faults import RUN_KINDS, VALIDATE_KINDS, Fault, parse_fault

from procs import run_in_session
from recorder_helpers import WORKERS, Ranks, free_port, kill_job_processes


def test_run_reads_validate_s_grammar_and_says_when():
    assert parse_fault("skip:1:3", RUN_KINDS) == parse_fault("skip:1:3") == Fault("skip", 1, 3)
    assert parse_fault("skip:2@call=5,group=tp", RUN_KINDS) == Fault("skip", 2, None, (("call", 5), ("group", "tp")))
    assert str(parse_fault("kill:0:term@step=3", RUN_KINDS)) == "kill:0:SIGTERM@step=3"
    assert str(parse_fault("hang:3:gil@after=2.5", RUN_KINDS)) == "hang:3:gil@after=2.5"
    fault = parse_fault("exit:1:4@step=2,call=9", RUN_KINDS)
    assert fault.when == (("call", 9), ("step", 2)) and Fault.from_dict(fault.to_dict()) == fault
    assert Fault("crash", 3, 1).to_dict() == {"kind": "crash", "rank": 3, "arg": 1}  # validate's JSON, unchanged


@pytest.mark.parametrize("text,kinds,why", [
    ("skip:1@call=2", VALIDATE_KINDS, "@WHEN is read only by distdoctor run --inject"),
    ("skip:1:2@call=3", RUN_KINDS, "give the call once: either skip:1:N or @call=N"),
    ("hang:1@at=3", RUN_KINDS, "WHEN 'at=3' is not one of call=K, group=G, after=SECONDS, step=N"),
    ("skip:1@group=tp", RUN_KINDS, "group=G counts calls: give call=K with it"),
    ("kill:1:HUP", RUN_KINDS, "SIGNAL 'HUP' is not one of SIGKILL, SIGTERM, SIGSEGV, SIGSTOP, SIGINT, SIGABRT, SIGBUS"),
    ("exit:1:300", RUN_KINDS, "CODE must be 0..255, got 300"),
    ("endthread:1", RUN_KINDS, "endthread needs NAME (a thread's name), e.g. endthread:1:loader@after=5"),
    ("nan:1:fc2", RUN_KINDS, "unknown kind 'nan' here (one of skip, twice, resize, retype, reroot, repeer, raise, "
                             "crash, exit, kill, hang, delay, endthread); nan is planted by the health monitor"),
])
def test_a_bad_spec_is_one_line(text, kinds, why):
    with pytest.raises(InputError) as exc:
        parse_fault(text, kinds)
    assert str(exc.value) == f"--inject {text}: {why}"


def test_run_refuses_a_bad_spec_before_starting_anything(tmp_path, cli_env):
    done = run_in_session([sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(tmp_path / "d"), "--inject",
                           "kill:x", "--", "true"], timeout=60, env=cli_env)
    assert done.returncode == 2 and "--inject kill:x: RANK 'x' is not an integer" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "d").exists()


KINDS = ["twice:1@call=1", "retype:1", "reroot:1@call=2", "repeer:0@call=3", "skip:2", "resize:2@call=2",
         "exit:1:3@call=2", "kill:1:SIGTERM@step=2", "hang:1@step=2", "endthread:1:loader@step=3",
         "delay:1:0.3@call=4"]
KIND_JOBS_AT_ONCE = 3  # jobs of 3 ranks each; most of a job's time is a wait (its gloo timeout, a healthy run)


def _run_kind(work, spec: str, timeout: float = 90):
    dumps = work / "dumps"
    r = Ranks("inject_kinds.py", 3, dumps, env={"DISTDOCTOR_INJECT": json.dumps([spec]), "GLOO_TIMEOUT": "6"})
    try:
        if spec.startswith("hang:"):  # the stopped rank never ends by itself: the others time out, then it is stopped
            rank = parse_fault(spec, RUN_KINDS).rank
            for n, p in enumerate(r.procs):
                if n != rank:
                    p.wait(timeout)
            assert r.procs[rank].poll() is None, "the stopped rank ended by itself"
            r.procs[rank].send_signal(signal.SIGTERM)
        codes = r.wait(timeout)
        traces = {n: loads(p.read_text()) for n in range(3) if (p := dumps / f"rank_{n}.jsonl").exists()}
        truth = json.loads(next(dumps.glob(".injected.rank_*.json")).read_text())
        return codes, traces, truth, r
    finally:
        r.kill()


@pytest.fixture(scope="module")
def kind_runs(request, tmp_path_factory) -> dict:
    """The drill jobs of the kinds this session runs, KIND_JOBS_AT_ONCE at a time: {spec: Future of what
    _run_kind returns} (a job's failure is raised by its own test)."""
    test = "test_each_kind_does_to_the_call_what_it_says"
    wanted = [item.callspec.params["spec"] for item in request.session.items
              if item.module is request.module and item.originalname == test]
    pool = ThreadPoolExecutor(KIND_JOBS_AT_ONCE)
    runs = {spec: pool.submit(_run_kind, tmp_path_factory.mktemp("kind"), spec) for spec in wanted}
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)
    for run in runs.values():
        if run.done() and run.exception() is None:
            for log in run.result()[3].logs:
                log.close()


def _calls(trace):
    return [(e.op, e.group, e.seq if e.seq is not None else e.p2p_seq) for e in trace.entries]


@pytest.mark.slow
@pytest.mark.parametrize("spec", KINDS)
def test_each_kind_does_to_the_call_what_it_says(kind_runs, spec):
    codes, traces, truth, ranks = kind_runs[spec].result(timeout=600)
    fault = parse_fault(spec, RUN_KINDS)
    [fired] = truth["fired"]
    assert truth["rank"] == fault.rank and fired["fault"] == str(fault) and fired["site"].endswith("inject_kinds.py:"
                                                                                                  + fired["site"].rsplit(":", 1)[1])
    mine = traces.get(fault.rank)
    healthy = _calls(traces[(fault.rank + 1) % 3])
    if fault.kind == "twice":
        assert _calls(mine)[:2] == [("all_reduce", "0", 1), ("all_reduce", "0", 2)]
        assert healthy[:2] == [("all_reduce", "0", 1), ("broadcast", "0", 2)]
    elif fault.kind == "retype":
        assert mine.entries[0].in_dtypes == ["float64"] and fired["change"] == {"tensor": ["float32", "float64"]}
    elif fault.kind == "reroot":
        assert mine.entries[1].op == "broadcast" and mine.entries[1].root == 1 and fired["call"]["seq"] == 2
    elif fault.kind == "repeer":
        assert mine.entries[2].op == "send" and mine.entries[2].peer == 2 and fired["change"] == {"dst": [1, 2]}
    elif fault.kind == "skip":
        assert _calls(mine)[0] == ("broadcast", "0", 1) and healthy[0] == ("all_reduce", "0", 1)
        assert fired["call"] == {"op": "all_reduce", "group": "0", "seq": 1}
    elif fault.kind == "resize":
        assert mine.entries[1].in_sizes == [[4]] and traces[0].entries[1].in_sizes == [[3]]
    elif fault.kind == "exit":
        assert codes[1] == 3 and fired["call"]["op"] == "broadcast"
    elif fault.kind == "kill":
        assert codes[1] != 0 and mine.dump_reason == "signal: SIGTERM" and fired["step"] == 2
    elif fault.kind == "hang":
        assert codes[0] != 0 and codes[1] != 0, codes  # the others' gloo timeout, then its SIGTERM
        assert "STEP 0" not in ranks.output(1)  # stopped in the first opt.step(), at the start of step 2
        assert mine.dump_reason == "signal: SIGTERM" and mine.entries[-1].state == "completed"  # in no call
        main = next(v for k, v in mine.stacks.items() if k.startswith("MainThread"))
        # the drill's own frame stays (where the program stands), under torch's optimizer wrapper that ran it:
        # the rank is in no collective at all, not inside torch where a C++-issued call could hold it
        assert main[0].filename.endswith("inject_kinds.py") and main[-1].filename.endswith("inject.py"), main
        assert any(f.filename.endswith("optimizer.py") for f in main) and outside_torch(mine), main
    elif fault.kind == "endthread":
        out = ranks.output(1)
        assert "STEP 0 loader_alive=True" in out and "STEP 1 loader_alive=False" in out, out[-2000:]
        assert codes == [0, 0, 0]
    elif fault.kind == "delay":
        times = [e.t_created for e in mine.entries]
        assert all(b - a >= 0.3 for a, b in zip(times[3:], times[4:])), times
        assert codes == [0, 0, 0]


JOB = WORKERS / "drill_job.py"
GRAD_ALL_REDUCE_LINE = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1)
                            if "dist.all_reduce(p.grad)" in line)


def run_drill(tmp_path, cli_env, spec, nproc=4, extra=()):
    dumps = tmp_path / "dumps"
    cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), "--suspect-floor", "2",
           "--hang-timeout", "6", "--kill-on-hang", *extra, "--inject", spec, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(JOB), "6"]
    try:
        done = run_in_session(cmd, timeout=240, env=dict(cli_env, OMP_NUM_THREADS="1"))
    finally:
        orphans = kill_job_processes(dumps)
    assert orphans == [], f"ranks outlived distdoctor run: {orphans}"
    truth = json.loads((dumps / ".injected.json").read_text())
    return done, dumps, truth


@pytest.mark.slow
def test_a_drill_under_torchrun_is_caught_and_its_truth_kept(tmp_path, cli_env):
    """rank 2 skips its 9th call (the world's all_reduce #6 of a gradient): the hang is suspected, the verdict
    names rank 2 first, and .injected.json says what rank 2 did, where."""
    done, dumps, truth = run_drill(tmp_path, cli_env, "skip:2@call=9")
    assert truth["inject"] == ["skip:2@call=9"]
    [fired] = truth["fired"]
    assert fired["rank"] == 2 and fired["call"] == {"op": "all_reduce", "group": "0", "seq": 6}
    assert fired["site"] == f"{JOB}:{GRAD_ALL_REDUCE_LINE}"
    out = done.stdout
    assert "HANG SUSPECTED" in out, out[-3000:]
    first = next(ln for ln in out.splitlines() if ln.startswith("1. "))
    assert "ranks [2" in first or "ranks [2]" in first, out[-3000:]
    assert f"the record: {dumps / '.injected.json'}" in done.stderr


@pytest.mark.slow
def test_a_rank_that_sends_to_the_wrong_peer_is_named_alone(tmp_path, cli_env):
    """rank 1's ring send goes to rank 3 instead of rank 2: rank 3 never posted a recv from it, rank 2 waits in
    a recv from it. Both sides' claims weighed: rank 1 chose the wrong peer; neither rank 3 nor rank 2 is blamed."""
    done, dumps, truth = run_drill(tmp_path, cli_env, "repeer:1@call=12")
    [fired] = truth["fired"]
    assert fired["call"]["op"] == "send" and fired["change"] == {"dst": [2, 3]}, fired
    firsts = [ln for ln in done.stdout.splitlines() if ln.startswith("1. ")]
    assert firsts and all(ln.startswith("1. p2p_deadlock: ranks [1] at send") for ln in firsts), done.stdout[-3000:]
