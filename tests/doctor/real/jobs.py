"""Real 4-rank Gloo training jobs written with torch's own parallel libraries, with ordinary bugs planted.

    python tests/doctor/real/jobs.py --list
    python tests/doctor/real/jobs.py --out DIR --scenario NAME [--stall S] [--deadline S]
    distdoctor run --dump-dir DIR/recorder --hang-timeout 4 --dump-on-exit -- \\
        python tests/doctor/real/jobs.py --out DIR --scenario NAME

Each scenario is a small training script in `train_*.py` beside this file (DDP, FSDP2 `fully_shard` 1-D and
HSDP over a 2-D DeviceMesh, `torch.distributed.pipelining`, `torch.distributed.checkpoint`, object collectives,
a hand-written p2p pipeline), a healthy control or one with a bug planted the way users cause them. The line
where the ranks part is marked in its source with `# parted: <scenario>` (tests/doctor/real/test_real_jobs.py
expects it in the finding).

This file is the launcher, the part torchrun or `mp.spawn` plays for a user: it imports torch and the
scenario's module once, then forks the 4 ranks (a fresh interpreter per rank would cost seconds of CPU each on a
small machine). A rank ends as an interpreter would: an uncaught exception goes to `sys.excepthook` (the
recorder dumps there), `atexit` handlers run, the exit status is 1. Unlike torchrun, the launcher does not
SIGTERM the other ranks when one fails: a failed rank's peers see the failure through Gloo and end themselves,
and each dump is then the rank's own account (torchrun's SIGTERM race is the recorder's tests' business).
SIGTERM, SIGINT or SIGHUP to the launcher reach every rank as SIGTERM (then SIGKILL 5 s later), as torchrun
stops its workers, and a rank dies with the launcher (PR_SET_PDEATHSIG).

Every rank also does what a user does to get Flight Recorder dumps from a Gloo job (TORCH_FR_BUFFER_SIZE is set
before torch is imported): a watchdog thread of its own writes `_dump_fr_trace` (pickle, with stack frames) and
`_dump_fr_trace_json` to

    DIR/fr/pickle/fr_rank_<r>.pkl      DIR/fr/json/fr_rank_<r>.json

when no training step finished for `--stall` seconds (again if the entries change while stalled), when the
training function raises, and at the end (after the final barrier); the last two wait until Gloo has retired
every entry that returned (at most 2 and 5 s), so a rerun gives the same dumps. Under
`distdoctor run` the recorder writes `rank_<r>.jsonl` and `rank_<r>.fr.pkl` into its own `--dump-dir` from the
same processes.

When every live rank has dumped for a stall and that dump has not changed for a second (and, under `distdoctor
run`, the recorder's `rank_<r>.jsonl` exists too), the launcher kills the ranks with SIGKILL, as a user ends a
hung job, so no later dump replaces the hang's. At `--deadline` it kills everything. It prints one JSON line
(also written to DIR/status.json): per-rank exit codes (-9: killed by the launcher), each rank's last Flight
Recorder dump (state, reason, `at` and `last_step`: wall-clock times of the dump and of the rank's last finished
step), whether the ranks ended by themselves, were killed after a hang or at the deadline, the seconds taken.
Exit status: 0 when every rank exited 0; 1 otherwise (a failure, a hang); 124 at the deadline.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime
import importlib
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 4
PG_TIMEOUT_S = 60  # init_process_group's; subgroups are created with it explicitly (they do not inherit it)
STABLE_S = 1.0  # a stalled rank's last Flight Recorder dump must be this old before the launcher kills it

# scenario -> the module (train_<x>.py, beside this file) whose function of that name is the training script
SCENARIOS = {
    "ddp_ok": "train_ddp",
    "ddp_crash": "train_ddp",
    "ddp_metric_dtype": "train_ddp",
    "ddp_straggler": "train_ddp",
    "metrics_group_alone": "train_ddp",
    "fsdp_ok": "train_fsdp",
    "fsdp_loader_hang": "train_fsdp",
    "fsdp_crash_midstep": "train_fsdp",
    "hsdp_ok": "train_fsdp",
    "hsdp_group_order": "train_fsdp",
    "dcp_rank0_save": "train_fsdp",
    "dcp_stuck_write": "train_fsdp",
    "pp_ok": "train_pipeline",
    "pp_microbatches": "train_pipeline",
    "p2p_both_recv": "train_pipeline",
    "object_root": "train_ddp",
}
# Jobs that complete yet carry latent hazards, and their fixed twins: `distdoctor lint`'s (test_lint_real.py), not
# diagnose's (test_real_jobs.py judges SCENARIOS only). The session fixture runs both sets at once.
LINT_SCENARIOS = {
    "lint_hazards": "train_lint",
    "lint_fixed": "train_lint",
}
ALL_SCENARIOS = {**SCENARIOS, **LINT_SCENARIOS}


class Ctx:
    """What a training function gets: its rank, the world size, the output directory, and `step_done()`, the
    heartbeat its Flight Recorder watchdog watches (a user's step-time watchdog)."""

    def __init__(self, rank: int, world: int, out: str, watchdog: "FlightRecorderDumps"):
        self.rank, self.world, self.out = rank, world, out
        self.pg_timeout = datetime.timedelta(seconds=PG_TIMEOUT_S)
        self._watchdog = watchdog

    def step_done(self) -> None:
        self._watchdog.beat()


class FlightRecorderDumps:
    """A rank's own Flight Recorder dumps, the way a Gloo user gets them (Gloo has no dump-on-timeout): a thread
    dumps when no step finished for `stall` seconds, and again whenever Flight Recorder's entries change while
    the step is still stalled (a slow step can stall, then go on into the real hang); `final()` dumps at the end
    or on an error. Each dump replaces the previous one atomically; DIR/fr/.state_<r> says when and why the last
    one was taken, and when the rank last finished a step."""

    def __init__(self, out: str, rank: int, stall: float):
        self.out, self.rank, self.stall = out, rank, stall
        self.lock = threading.Lock()
        self.last_beat = time.monotonic()
        self.dumped_at: tuple | None = None  # the entries' signature at the last stall dump
        self.closed = False
        threading.Thread(target=self._watch, name="fr-dump-watchdog", daemon=True).start()

    def beat(self) -> None:
        self.last_beat = time.monotonic()
        self.dumped_at = None

    def _watch(self) -> None:
        while not self.closed:
            time.sleep(0.2)
            idle = time.monotonic() - self.last_beat
            if idle > self.stall:
                entries = _fr_entries()
                signature = (len(entries), entries[-1].get("record_id") if entries else None,
                             sum(1 for e in entries if e.get("retired")))
                if signature != self.dumped_at:
                    self.dumped_at = signature
                    self.dump("stall", f"no training step finished for {idle:.1f} s")

    def final(self, state: str, reason: str) -> None:
        # Gloo retires entries late (see _settle): without waiting, the same crash dumps a returned call as
        # pending in one run and not in the next, and the suite's views would differ from run to run.
        _settle(5.0 if state == "finished" else 2.0)
        self.dump(state, reason)
        self.closed = True

    def dump(self, state: str, reason: str) -> None:
        from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json

        with self.lock:
            if self.closed:
                return
            base = os.path.join(self.out, "fr")
            for form, ext, data in (("pickle", "pkl", _dump_fr_trace(True, True, False)),
                                    ("json", "json", _dump_fr_trace_json(True, False))):
                path = os.path.join(base, form, f"fr_rank_{self.rank}.{ext}")
                _write_atomic(path, data if isinstance(data, bytes) else data.encode())
            last_step = time.time() - (time.monotonic() - self.last_beat)
            _write_atomic(os.path.join(base, f".state_{self.rank}"), json.dumps(
                {"state": state, "reason": reason[:300], "at": time.time(), "last_step": last_step}).encode())


def _write_atomic(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _fr_entries() -> list[dict]:
    from torch._C._distributed_c10d import _dump_fr_trace_json

    return json.loads(_dump_fr_trace_json(True, False)).get("entries") or []


def _settle(limit_s: float = 5.0) -> None:
    """Gloo marks a finished collective's Flight Recorder entry retired from a background thread a moment after
    it returned: wait for that, so a finished rank's last dump never shows a returned call as pending."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and not all(e.get("retired") for e in _fr_entries()):
        time.sleep(0.02)


# ---- one rank ----------------------------------------------------------------------------------------------

def _rank_main(train, rank: int, out: str, stall: float) -> None:
    """What a user's train.py does around its training function."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))  # env:// from the launcher
    watchdog = FlightRecorderDumps(out, rank, stall)
    try:
        train(Ctx(rank, WORLD, out, watchdog))
        dist.barrier()  # everyone is done before anyone tears down
    except Exception as exc:
        watchdog.final("error", f"{type(exc).__name__}: {exc}")
        raise
    watchdog.final("finished", "finished")
    dist.destroy_process_group()


def _rank_process(train, rank: int, port: int, out: str, stall: float) -> None:
    """The body of a forked rank; never returns. Ends as an interpreter running train.py would."""
    _die_with_parent()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))
    code = 0
    try:
        _rank_main(train, rank, out, stall)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _die_with_parent() -> None:
    """SIGKILL this rank if the launcher dies (as torch.multiprocessing does): no rank outlives its job."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the harness's process-group kill still covers it
        pass
    if os.getppid() == 1:  # the launcher died before prctl
        os._exit(1)


# ---- the launcher ------------------------------------------------------------------------------------------

def _forward_termination(pids: dict[int, int]) -> None:
    """SIGTERM/SIGINT/SIGHUP to the launcher (what `distdoctor run` forwards, or a user's Ctrl-C) reach every rank
    as SIGTERM, as torchrun stops its workers; the ranks that have not ended 5 s later are killed."""
    def stop(signum, _frame):
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        alive = set(pids.values())
        while alive and time.monotonic() < deadline:
            alive = {pid for pid in alive if os.waitpid(pid, os.WNOHANG)[0] == 0}
            time.sleep(0.05)
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fr_state(out: str, rank: int) -> dict | None:
    try:
        with open(os.path.join(out, "fr", f".state_{rank}")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _recorder_dir() -> str | None:
    """The recorder's dump directory when this job runs under `distdoctor run` (or with DISTDOCTOR_TRACE)."""
    if os.environ.get("DISTDOCTOR_TRACE") not in (None, "", "0"):
        return os.environ.get("DISTDOCTOR_DUMP_DIR") or "distdoctor-dumps"
    return None


def launch(scenario: str, out: str, stall: float = 3.0, deadline: float = 60.0) -> dict:
    """Run one scenario's 4 ranks to the end (or to their hang dumps); returns the status dict."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # Flight Recorder records only if set before torch starts
    import torch

    torch.set_num_threads(1)  # 4 ranks on a small machine: no intra-op thread pools fighting for cores
    train = getattr(importlib.import_module(ALL_SCENARIOS[scenario]), scenario)
    # The first Flight Recorder dump with stack frames symbolizes torch's libraries (seconds): do it once here,
    # so every forked rank inherits warm caches.
    from torch._C._profiler import gather_traceback, symbolize_tracebacks

    symbolize_tracebacks([gather_traceback(True, True, True)])
    shutil.rmtree(os.path.join(out, "fr"), ignore_errors=True)  # a previous run's dumps must not count as ours
    os.makedirs(out, exist_ok=True)
    port = _free_port()
    t0 = time.monotonic()
    sys.stdout.flush()
    sys.stderr.flush()
    pids = {}
    for rank in range(WORLD):
        pid = os.fork()
        if pid == 0:
            _rank_process(train, rank, port, out, stall)
        pids[rank] = pid
    _forward_termination(pids)
    exits: dict[int, int | None] = {r: None for r in range(WORLD)}
    recorder = _recorder_dir()
    ended = "exited"
    while any(code is None for code in exits.values()):
        time.sleep(0.1)
        for rank, pid in pids.items():
            if exits[rank] is None:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    exits[rank] = os.waitstatus_to_exitcode(status)
        live = [r for r, code in exits.items() if code is None]
        if not live:
            break
        # A rank that raised ends by itself; a stalled one is killed once its stall dump has not changed for a
        # second and, under the recorder, the recorder has written both its files for it too.
        states = {r: _fr_state(out, r) or {} for r in live}
        dumped = all(st.get("state") == "stall" and time.time() - st["at"] >= STABLE_S and
                     (recorder is None or all(os.path.exists(os.path.join(recorder, f"rank_{r}.{ext}"))
                                              for ext in ("jsonl", "fr.pkl")))
                     for r, st in states.items())
        timed_out = time.monotonic() - t0 > deadline
        if dumped or timed_out:
            ended = "deadline" if timed_out and not dumped else "hang"
            # Freeze them all before killing any: a rank that outlived a peer by a moment would see its
            # connection close, raise, and dump again over its stall dump (completion.py reads such dumps; the
            # plan here is the stall dumps).
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for r in live:
                    try:
                        os.kill(pids[r], sig)
                    except ProcessLookupError:
                        pass
            for r in live:
                os.waitpid(pids[r], 0)
                exits[r] = -signal.SIGKILL
            break
    status = {"scenario": scenario, "exitcodes": [exits[r] for r in range(WORLD)], "ended": ended,
              "fr_dumps": {r: _fr_state(out, r) for r in range(WORLD)}, "recorder_dir": recorder,
              "seconds": round(time.monotonic() - t0, 2)}
    with open(os.path.join(out, "status.json"), "w") as f:
        json.dump(status, f, indent=1)
    return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="directory for the Flight Recorder dumps and status.json")
    parser.add_argument("--scenario", help="one of --list")
    parser.add_argument("--list", action="store_true", help="print the scenarios and exit")
    parser.add_argument("--stall", type=float, default=3.0, help="seconds without a finished step before a rank "
                                                                  "dumps Flight Recorder (default 3)")
    parser.add_argument("--deadline", type=float, default=60.0, help="kill every rank after this many seconds")
    args = parser.parse_args()
    if args.list:
        for name, module in ALL_SCENARIOS.items():
            print(f"{name:24s} {module}.py")
        return 0
    if not args.out or not args.scenario:
        parser.error("--out and --scenario are required (or --list)")
    if args.scenario not in ALL_SCENARIOS:
        parser.error(f"unknown scenario {args.scenario!r}; known: {', '.join(ALL_SCENARIOS)}")
    sys.path.insert(0, HERE)
    status = launch(args.scenario, os.path.abspath(args.out), args.stall, args.deadline)
    print(json.dumps(status), flush=True)
    if status["ended"] == "deadline":
        return 124
    return 0 if all(code == 0 for code in status["exitcodes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
