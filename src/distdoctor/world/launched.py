"""run_job under an existing launcher (torchrun, or anything that sets RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT).

This process is one rank. Everything the reporter needs travels through the process group's store (torchrun's
agent hosts it, so it outlives any single worker):
  <job>/start/<r>  host and pid        <job>/phase/<r>  what the rank is doing and since when
  <job>/rec/<r>    emitted records     <job>/hb/<r>     heartbeat, every second, from a thread
  <job>/done/<r>   the rank's outcome  <job>/reported   the reporter has gathered everything
Gathering: each rank writes done/<r>; rank 0 waits until every rank is done or gone (heartbeat older than
HEARTBEAT_STALE_S), never longer than timeout + 5 s. A rank that is alive but not done is hung; one whose
heartbeat stopped died or became unreachable. Non-reporters wait for `reported`; if every lower rank is gone,
the lowest survivor reports instead, so the loss of rank 0 is still reported when at all possible.
A SIGTERM from the launcher (it stops the group when any worker fails) cuts every wait short.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable

from distdoctor.world.blame import GONE, HUNG, NEVER_STARTED, RUNNING, RankEnd, judge
from distdoctor.world.config import WorldConfig, pick_iface, resolve_backend
from distdoctor.world.result import JobResult, LostRank
from distdoctor.world.worker import WorkerContext, describe_exception, init_process_group, load_target

HEARTBEAT_S = 0.5
HEARTBEAT_STALE_S = 2.5
# A rank inside a collective raises when the collective times out, a moment after its peers: it is hung only
# once it has been silent for a timeout plus this grace.
STUCK_GRACE_S = 6.0
_job_counter = itertools.count()


class _StoreChannel:
    """Under a launcher: keys in the process group's store, which outlives any single worker."""

    def __init__(self, store, prefix: str, rank: int, on_event=None):
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.on_event = on_event
        self.lock = threading.Lock()

    def send(self, event: dict) -> None:
        kind = event["type"]
        with self.lock:
            if kind == "phase":
                self.store.set(f"{self.prefix}/phase/{self.rank}", json.dumps(event))
            elif kind == "record":
                self.store.append(f"{self.prefix}/rec/{self.rank}", json.dumps(event["record"]) + "\n")
            elif kind in ("start", "hb"):
                self.store.set(f"{self.prefix}/{kind}/{self.rank}", json.dumps(event))
        if kind == "progress" and self.on_event is not None:
            self.on_event(event)

    def done(self, outcome: dict) -> None:
        with self.lock:
            self.store.set(f"{self.prefix}/done/{self.rank}", json.dumps(outcome))



class _Terminated(BaseException):
    """The launcher asked this rank to stop (SIGTERM)."""


class _Heartbeat(threading.Thread):
    def __init__(self, channel):
        super().__init__(name="distdoctor-heartbeat", daemon=True)
        self.channel = channel
        self.stop_event = threading.Event()

    def run(self) -> None:
        while True:
            with contextlib.suppress(Exception):
                self.channel.send({"type": "hb", "t": time.time()})
            if self.stop_event.wait(HEARTBEAT_S):
                return


def _get_json(store, key: str):
    try:
        if not store.check([key]):
            return None
        return json.loads(store.get(key))
    except Exception:  # noqa: BLE001 - a torn or missing key reads as absent
        return None


def run_in_rank(target: str, args: dict, cfg: WorldConfig, on_event: Callable | None,
                store_path: str | None = None, store_in_rank0: bool = False) -> JobResult:
    """This process is one rank of a launcher's world. `store_path`: meet through a FileStore there (a one-node
    srun/mpirun world) instead of MASTER_ADDR/MASTER_PORT. `store_in_rank0`: the TCPStore lives in rank 0's
    process (srun/mpirun across nodes), not in a launcher agent, so rank 0 must outlive the others' last read."""
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = resolve_backend(cfg, local_world)
    multi_host = world_size > local_world
    iface = cfg.iface or (pick_iface(os.environ.get("MASTER_ADDR", cfg.master_addr), multi_host)
                          if backend == "gloo" else None)
    prefix = f"distdoctor/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/job{next(_job_counter)}"
    start = time.time()

    terminated, working = threading.Event(), threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        def on_term(signum, frame):
            # Interrupt only the rank's own work (a blocking collective, the rendezvous). Raised anywhere else
            # (inside an except clause, between the outcome and the report) it would escape every handler and
            # end the rank without a report; there the flag alone cuts the gather's waits short.
            if not terminated.is_set():
                terminated.set()
                if working.is_set():
                    raise _Terminated()
        previous = signal.signal(signal.SIGTERM, on_term)

    ctx = None
    heartbeat = None
    outcome: dict
    # The function's own prints must not reach stdout, where the reporter may write one JSON document.
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        try:
            working.set()
            try:
                device, timeout, local_rank = init_process_group(backend, cfg.timeout_s, iface, store_path)
                store = dist.distributed_c10d._get_default_store()
                channel = _StoreChannel(store, prefix, rank, on_event if rank == 0 else None)
                channel.send({"type": "start", "host": socket.gethostname(), "pid": os.getpid(), "t": time.time()})
                heartbeat = _Heartbeat(channel)
                heartbeat.start()
                ctx = WorkerContext(rank, world_size, local_rank, backend, device, timeout, channel)
                value = load_target(target)(ctx, **args)
            finally:
                working.clear()
            json.dumps(value)  # not JSON-serializable: this rank's error, not a store failure later
            outcome = {"ok": True, "value": value}
        except _Terminated as stop:
            outcome = {"ok": False, "error": _stopped_by(stop),
                       "phase": (ctx.failed_in or ctx.current_phase) if ctx else None}
        except Exception as exc:  # noqa: BLE001 - reported, and the job fails
            outcome = {"ok": False, "error": describe_exception(exc),
                       "phase": (ctx.failed_in or ctx.current_phase) if ctx else None}
        if ctx is None:  # no process group, no store: this rank can only speak for itself
            return _alone(rank, world_size, backend, iface, outcome, start)
        # Reporting goes through the store on rank 0's host. If that host is cut off, a store call can block
        # until the link returns: never wait longer than the gather's own bound plus a margin.
        guard = threading.Timer(cfg.timeout_s + 20, _give_up_on_store, (rank, outcome))
        guard.daemon = True
        guard.start()
        try:
            channel.done(outcome)
            result = _gather(store, prefix, rank, world_size, backend, iface, cfg.timeout_s, terminated)
        except Exception as exc:  # noqa: BLE001 - the store is gone: its host (rank 0's machine) is down
            result = _alone(rank, world_size, backend, iface, outcome, start,
                            f"unreachable: the rendezvous store is gone ({describe_exception(exc)})")
        finally:
            guard.cancel()
        if store_in_rank0 and rank == 0 and result.is_reporter:
            _wait_for_readers(store, prefix, result)
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
        if heartbeat is not None:
            heartbeat.stop_event.set()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    result.wall_s = time.time() - start
    if result.ok:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return result


def _stopped_by(stop: _Terminated) -> str:
    """The launcher's SIGTERM landed while the rank's own error was being raised: that error is the rank's end,
    the signal only its consequence."""
    cause = stop.__context__
    if isinstance(cause, Exception):
        return describe_exception(cause)
    return "terminated by the launcher (another worker failed)"


def _give_up_on_store(rank: int, outcome: dict) -> None:
    """The rendezvous store stopped answering (its host is cut off): say so in one line and end this rank."""
    master = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    what = "finished" if outcome.get("ok") else f"failed ({outcome.get('error')})"
    sys.stderr.write(f"distdoctor: rank {rank} on {socket.gethostname()}: {what}, but the rendezvous store at "
                     f"{master} is unreachable; giving up on the report\n")
    sys.stderr.flush()
    os._exit(1)


def _alone(rank, world_size, backend, iface, outcome, start, store_gone: str | None = None) -> JobResult:
    """This rank can only speak for itself: the world never formed, or the store (on rank 0's host) is gone.

    World not formed: every rank failed the same way, so rank 0 alone reports it. Store gone: nobody can tell
    who else survived, so every survivor reports that rank 0's host is unreachable."""
    result = JobResult(world_size=world_size, backend=backend, device="cuda" if backend == "nccl" else "cpu",
                         iface=iface, mode="launcher", ok=False, is_reporter=rank == 0 or store_gone is not None)
    if outcome.get("ok"):
        result.results[rank] = outcome["value"]
    else:
        result.errors[rank] = outcome["error"]
    if store_gone is not None:
        result.lost.append(LostRank(0, os.environ.get("MASTER_ADDR", "?"), store_gone, None))
    else:
        result.lost.append(LostRank(rank, socket.gethostname(), f"world did not start: {outcome.get('error')}",
                                      None))
    return result


def _rank_gone(store, prefix: str, r: int, now: float) -> bool:
    hb = _get_json(store, f"{prefix}/hb/{r}")
    done = store.check([f"{prefix}/done/{r}"])
    return not done and (hb is None or now - hb["t"] > HEARTBEAT_STALE_S)


def _rank_stuck(store, prefix: str, r: int, now: float, timeout_s: float) -> bool:
    """Alive but silent for a whole timeout while the reporter is done: every collective it waits in has
    timed out by now, so it is hung."""
    if store.check([f"{prefix}/done/{r}"]):
        return False
    phase = _get_json(store, f"{prefix}/phase/{r}") or _get_json(store, f"{prefix}/start/{r}")
    return phase is not None and now - phase["t"] > timeout_s + STUCK_GRACE_S


READERS_WAIT_S = 5.0


def _wait_for_readers(store, prefix: str, result: JobResult) -> None:
    """The store dies with this process: wait (briefly) until every other rank that finished has read the report
    flag, so that none of them finds the store gone and reports rank 0 lost."""
    expected = sum(1 for r in result.results if r != 0) + sum(1 for r in result.errors if r != 0)
    deadline = time.time() + READERS_WAIT_S
    with contextlib.suppress(Exception):
        while store.add(f"{prefix}/read", 0) < expected and time.time() < deadline:
            time.sleep(0.05)


def _gather(store, prefix, rank, world_size, backend, iface, timeout_s, terminated) -> JobResult:
    deadline = time.time() + timeout_s + STUCK_GRACE_S + 5
    done_keys = [f"{prefix}/done/{r}" for r in range(world_size)]
    is_reporter = rank == 0
    while True:
        now = time.time()
        if terminated.is_set():  # the launcher stops us soon: long enough to see a dead peer's heartbeat stop
            deadline = min(deadline, now + HEARTBEAT_STALE_S + 1.5)
        if store.check([f"{prefix}/reported"]):  # a lower survivor already reported in our place
            is_reporter = False
            break
        if is_reporter:
            pending = [r for r in range(world_size) if not store.check([done_keys[r]])]
            if not pending or now > deadline or all(
                    _rank_gone(store, prefix, r, now) or _rank_stuck(store, prefix, r, now, timeout_s)
                    for r in pending):
                break
        else:
            if all(_rank_gone(store, prefix, q, now) or _rank_stuck(store, prefix, q, now, timeout_s)
                   for q in range(rank)) or now > deadline + 5:
                is_reporter = True  # every lower rank is gone: report in their place
                continue
        time.sleep(0.2)

    result = JobResult(world_size=world_size, backend=backend, device="cuda" if backend == "nccl" else "cpu",
                         iface=iface, mode="launcher", is_reporter=is_reporter)
    if not is_reporter:
        outcome = _get_json(store, done_keys[rank]) or {}
        result.ok = bool(outcome.get("ok"))
        with contextlib.suppress(Exception):
            store.add(f"{prefix}/read", 1)  # done with the store: its host may go
        return result
    now = time.time()
    ends = []
    for r in range(world_size):  # what the store says of each rank, as facts for the one blame policy (blame.py)
        start = _get_json(store, f"{prefix}/start/{r}") or {}
        phase = _get_json(store, f"{prefix}/phase/{r}") or {}
        end = RankEnd(r, start.get("host", "?"), phase.get("phase"), outcome=_get_json(store, done_keys[r]))
        ends.append(end)
        with contextlib.suppress(Exception):
            if store.check([f"{prefix}/rec/{r}"]):
                raw = store.get(f"{prefix}/rec/{r}").decode()
                end.records = [json.loads(line) for line in raw.splitlines() if line.strip()]
        if end.outcome is not None:
            continue
        hb = _get_json(store, f"{prefix}/hb/{r}")
        if not start:
            end.fate, end.why = NEVER_STARTED, "unreachable: never joined"
        elif hb is not None and now - hb["t"] <= HEARTBEAT_STALE_S:
            since = phase.get("t") or start.get("t") or now
            # Alive: hung once silent for a timeout and a grace; before that most likely waiting in a collective
            # for a rank that is gone.
            end.fate, end.seconds = (HUNG, now - since) if now - since > timeout_s + STUCK_GRACE_S else (RUNNING, None)
        else:
            end.fate, end.seconds = GONE, now - (hb["t"] if hb else start.get("t", now))
    judge(ends, result)
    with contextlib.suppress(Exception):
        store.set(f"{prefix}/reported", "1")
    return result
