"""run_job's standalone mode: start `nproc` local workers with torch's elastic launcher and watch them.

The parent is the reporter. Workers are started by `elastic_launch` (c10d rendezvous on the master address and
a free port, max_restarts=0; forked for CPU worlds, spawned for NCCL). Each worker streams JSON lines to its own
append-only file in a private run directory (start, phase, record, progress; O_APPEND line writes survive a hard
death) and writes its outcome file at the end. A watcher thread in the parent tails the files, forwards rank
0's progress to on_event, peeks exit codes (waitid WNOWAIT: the agent can still reap), and kills a rank that
made no progress for a whole timeout after another rank ended.

How a lost rank is named: `_classify` turns what the watcher saw of each rank (its outcome, exit code, when it
last made progress, whether the watcher killed it) into facts for blame.py, the policy every world shares.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from distdoctor.world.blame import EXITED, HUNG, NEVER_STARTED, STOPPED, RankEnd, judge
from distdoctor.world.config import WorldConfig, pick_iface, resolve_backend, resolve_nproc
from distdoctor.world.result import JobResult
from distdoctor.world.worker import WorkerContext, describe_exception, init_process_group, load_target


class _FileChannel:
    """Standalone: one append-only JSON-lines file per rank; O_APPEND line writes survive a hard death."""

    def __init__(self, run_dir: str, rank: int):
        self.dir = Path(run_dir)
        self.rank = rank
        self.fd = os.open(self.dir / f"rank{rank}.events", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def send(self, event: dict) -> None:
        os.write(self.fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def done(self, outcome: dict) -> None:
        tmp = self.dir / f"rank{self.rank}.result.tmp"
        tmp.write_text(json.dumps(outcome))
        os.replace(tmp, self.dir / f"rank{self.rank}.result")


GO_FILE = "go"


def _wait_for_siblings(run_dir: str, limit_s: float = 120.0) -> None:
    """Touch nothing of torch.distributed until every worker has been forked.

    The agent hosts the rendezvous TCPStore in the parent, served by a C++ thread. A worker forked while that
    thread serves an earlier sibling could inherit one of its mutexes locked, and then block forever in
    init_process_group. So the parent's watcher writes GO_FILE once every worker has reported its start, and
    no worker talks to the store before it: during the forks the store thread is idle."""
    path = os.path.join(run_dir, GO_FILE)
    deadline = time.time() + limit_s
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.01)


def standalone_worker(target: str, args: dict, backend: str, timeout_s: float, iface: str | None,
                       run_dir: str, store_path: str | None = None) -> None:
    """Entry point of one elastic worker process (module-level so it can be pickled for spawn)."""
    # Worker output must never reach the reporter's stdout (it may be a JSON document). Fresh stream objects:
    # a forked worker must not touch the parent's, whose locks another parent thread (a progress display) may
    # have held at fork time; multiprocessing flushed them before forking.
    os.dup2(2, 1)
    sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8", errors="replace")
    # Forked from a Jupyter kernel, a worker must not talk to the notebook: rich and IPython's display would send
    # messages on the kernel's sockets, which the fork shares with the parent (and corrupts there).
    import builtins

    builtins.__dict__.pop("get_ipython", None)
    if _start_method(backend) == "fork":
        # libgomp is not fork-safe: if the forking thread of the parent ever ran a parallel region (a notebook
        # cell, or a reference computed between two jobs), a multi-threaded op here waits forever for pool
        # threads the fork did not copy. One intra-op thread, as PyTorch's DataLoader workers do.
        import torch

        torch.set_num_threads(1)
    # A forked worker inherits the agent's handlers (they raise SignalException): a stop request from the
    # agent must simply end the worker, as it would a spawned one.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    rank = int(os.environ["RANK"])
    channel = _FileChannel(run_dir, rank)
    channel.send({"type": "start", "pid": os.getpid(), "host": socket.gethostname(), "t": time.time()})
    _wait_for_siblings(run_dir)
    ctx = None
    try:
        device, timeout, local_rank = init_process_group(backend, timeout_s, iface, store_path)
        import torch.distributed as dist

        ctx = WorkerContext(rank, dist.get_world_size(), local_rank, backend, device, timeout, channel)
        value = load_target(target)(ctx, **args)
        channel.done({"ok": True, "value": value})
    except BaseException as exc:  # noqa: BLE001 - everything a rank raises is reported, then the rank fails
        message = describe_exception(exc)
        with contextlib.suppress(Exception):
            phase = (ctx.failed_in or ctx.current_phase) if ctx else None
            channel.done({"ok": False, "error": message, "phase": phase,
                          "traceback": traceback.format_exc()[-4000:]})
        sys.stderr.flush()
        # A failing rank must exit non-zero so that the agent stops the group at once; os._exit skips
        # process-group teardown, which can itself block on a dead peer.
        os._exit(1)
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        dist.destroy_process_group()




class _RankState:
    def __init__(self):
        self.pid: int | None = None
        self.host = socket.gethostname()
        self.phase: str | None = None
        self.last_activity: float | None = None
        self.records: list = []
        self.outcome: dict | None = None
        self.ended_at: float | None = None
        self.killed_hung: float | None = None  # seconds without progress when the watchdog killed it
        self.exit_code: int | None = None  # as multiprocessing gives it: negative for a signal
        self.offset = 0


def _peek_exit(pid: int) -> tuple[bool, int | None]:
    """(ended, exit code) of our child without reaping it (WNOWAIT), so the elastic agent still can."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # already reaped by the agent, or not our child
        return (not _pid_alive(pid), None)
    if info is None or info.si_pid == 0:
        return (False, None)
    if info.si_code == os.CLD_EXITED:
        return (True, info.si_status)
    return (True, -info.si_status)  # killed or dumped by a signal


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class _Watcher(threading.Thread):
    """Tails each rank's event file, forwards rank 0's progress, and kills ranks that stopped making progress."""

    def __init__(self, run_dir: Path, n: int, timeout_s: float, on_event):
        super().__init__(name="distdoctor-watcher", daemon=True)
        self.run_dir = run_dir
        self.ranks = [_RankState() for _ in range(n)]
        self.timeout_s = timeout_s
        self.on_event = on_event
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.go_sent = False

    def poll_exits(self) -> None:
        now = time.time()
        for st in self.ranks:
            if st.pid is not None and st.exit_code is None and (st.ended_at is None or st.killed_hung is not None):
                ended, code = _peek_exit(st.pid)
                if ended:
                    st.ended_at = st.ended_at or now
                    st.exit_code = code

    def poll(self) -> None:
        now = time.time()
        with self.lock:
            for rank, st in enumerate(self.ranks):
                path = self.run_dir / f"rank{rank}.events"
                if path.exists():
                    with open(path, "rb") as f:
                        f.seek(st.offset)
                        chunk = f.read()
                    end = chunk.rfind(b"\n") + 1  # only whole lines; a torn tail is read next time
                    st.offset += end
                    for line in chunk[:end].splitlines():
                        self._apply(rank, st, json.loads(line))
                result = self.run_dir / f"rank{rank}.result"
                if st.outcome is None and result.exists():
                    st.outcome = json.loads(result.read_text())
                    st.ended_at = st.ended_at or now
            if not self.go_sent and all(st.pid is not None for st in self.ranks):
                (self.run_dir / GO_FILE).touch()
                self.go_sent = True
            self.poll_exits()
            self._kill_hung(now)

    def _apply(self, rank: int, st: _RankState, ev: dict) -> None:
        kind = ev.get("type")
        st.last_activity = max(st.last_activity or 0.0, ev.get("t", 0.0))
        if kind == "start":
            st.pid, st.host = ev["pid"], ev["host"]
        elif kind == "phase":
            st.phase = ev["phase"]
        elif kind == "record":
            st.records.append(ev["record"])
        elif kind == "progress" and rank == 0 and self.on_event is not None:
            with contextlib.suppress(Exception):
                self.on_event(ev)

    def _kill_hung(self, now: float) -> None:
        ended = [st.ended_at for st in self.ranks if st.ended_at is not None]
        first_end = min(ended) if ended else None
        for st in self.ranks:
            if st.ended_at is not None or st.pid is None or st.last_activity is None:
                continue
            idle = now - st.last_activity
            # Hung: silent for a whole timeout after a peer already finished or failed (every collective it
            # could be waiting in has timed out by then). Silence alone is no sign while every rank is busy: a
            # bench row of a large size spends minutes in one phase on every rank.
            if first_end is not None and now - first_end > self.timeout_s and idle > self.timeout_s:
                st.killed_hung = idle
                with contextlib.suppress(OSError):
                    os.kill(st.pid, signal.SIGKILL)
                st.ended_at = now

    def run(self) -> None:
        # Exits are polled faster than the agent's monitor (0.5 s) so that we, not it, see each exit code first;
        # until every worker has started, the files too (the workers wait for GO_FILE).
        tick = 0
        while not self.stop_event.wait(0.05):
            tick += 1
            with contextlib.suppress(Exception):
                with self.lock:
                    self.poll_exits()
                if tick % 4 == 0 or not self.go_sent:
                    self.poll()


def _quiet_elastic_logs():
    """torch elastic logs every launch at INFO and every failure at ERROR; the report says it better."""
    saved = {}
    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing",
                 "torch.distributed.elastic.agent", "torch.distributed.elastic.multiprocessing",
                 "torch.distributed.elastic.rendezvous"):
        logger = logging.getLogger(name)
        saved[name] = logger.level
        logger.setLevel(logging.CRITICAL)
    return saved


def _start_method(backend: str) -> str:
    """fork for CPU worlds: the workers reuse the parent's imported torch (spawn re-imports it in every worker,
    most of a quick run's wall time on a small machine) and stay our children, so their exit codes can be
    read. spawn for NCCL: CUDA cannot be used in a child forked after the parent touched the driver.
    DISTDOCTOR_START_METHOD overrides."""
    return os.environ.get("DISTDOCTOR_START_METHOD") or ("fork" if backend == "gloo" else "spawn")


def _launch_config(n: int, cfg: WorldConfig, port: int, run_dir: Path, backend: str):
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    import dataclasses

    if _local_only(cfg):
        # torch's TCPStore listens on every interface whatever address it is given, so a loopback world meets
        # through files in the private run directory instead: nothing listens on the network but gloo's pair
        # sockets, which bind the loopback interface.
        endpoint, rdzv = str(run_dir / "rdzv.store"), {"store_type": "file"}
    else:
        endpoint, rdzv = f"{cfg.master_addr}:{port}", {"is_host": True}
    kw = dict(
        min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=f"distdoctor-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d", rdzv_endpoint=endpoint,
        rdzv_configs={"timeout": int(max(cfg.timeout_s, 30)), **rdzv}, max_restarts=0,
        monitor_interval=0.5, start_method=_start_method(backend), local_addr=cfg.master_addr,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs")),
    )
    fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    if "shutdown_timeout" in fields:
        kw["shutdown_timeout"] = 3  # a rank that ignores SIGTERM is SIGKILLed after 3 s, not 30
    return LaunchConfig(**kw)


def _local_only(cfg: WorldConfig) -> bool:
    """A standalone world on the loopback address (the default): the user did not ask to be reachable."""
    try:
        return ipaddress.ip_address(socket.gethostbyname(cfg.master_addr)).is_loopback
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _agent_store_not_shared(local: bool):
    """The elastic agent otherwise starts a TCPStore server (listening on every interface) for the workers."""
    if not local:
        yield
        return
    key = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    saved = os.environ.get(key)
    os.environ[key] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def run_standalone(target: str, args: dict, cfg: WorldConfig, on_event) -> JobResult:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    n = resolve_nproc(cfg)
    backend = resolve_backend(cfg, n)
    iface = cfg.iface
    if iface is None and backend == "gloo":
        iface = pick_iface(cfg.master_addr)  # loopback for 127.0.0.1: nothing listens beyond this machine
    port = cfg.master_port or 0  # 0: the store binds a free port itself (no window for another job to take it)
    run_dir = Path(tempfile.mkdtemp(prefix="distdoctor-run-"))
    watcher = _Watcher(run_dir, n, cfg.timeout_s, on_event)
    start = time.time()
    failures: dict[int, Any] = {}
    launch_error: str | None = None
    saved = _quiet_elastic_logs()
    watcher.start()
    try:
        local = _local_only(cfg)
        launch = elastic_launch(_launch_config(n, cfg, port, run_dir, backend), standalone_worker)
        with _agent_store_not_shared(local):
            launch(target, args, backend, cfg.timeout_s, iface, str(run_dir),
                   str(run_dir / "pg.store") if local else None)
    except ChildFailedError as exc:
        failures = dict(exc.failures)
    except SignalException as exc:  # Ctrl-C or SIGTERM to us: the agent has stopped the workers already
        _reap(watcher)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise KeyboardInterrupt(f"stopped by signal {exc.sigval}") from None
    except KeyboardInterrupt:
        _reap(watcher)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    except Exception as exc:  # rendezvous or start-up failure: no world at all
        launch_error = describe_exception(exc)
    finally:
        watcher.stop_event.set()
        watcher.join()
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
    watcher.poll()
    _reap(watcher)
    result = _classify(watcher, n, backend, iface, failures, launch_error)
    result.wall_s = time.time() - start
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _reap(watcher: _Watcher) -> None:
    """Belt and braces: no worker may outlive run_job, whatever the agent did."""
    for st in watcher.ranks:
        if st.pid is not None and _pid_alive(st.pid):
            with contextlib.suppress(OSError):
                os.kill(st.pid, signal.SIGKILL)


def _classify(watcher: _Watcher, n: int, backend: str, iface, failures: dict, launch_error) -> JobResult:
    """What the watcher saw of each rank, as facts for the one blame policy (blame.py)."""
    ended = [st.ended_at for st in watcher.ranks if st.ended_at is not None]
    ends = []
    for rank, st in enumerate(watcher.ranks):
        end = RankEnd(rank, st.host, st.phase, st.records, st.outcome)
        ends.append(end)
        if st.outcome is not None:
            continue
        failure = failures.get(rank)
        code = st.exit_code if st.exit_code is not None else getattr(failure, "exitcode", None)
        idle = (st.ended_at or time.time()) - (st.last_activity or st.ended_at or time.time())
        first = st.ended_at is not None and st.ended_at <= min(ended) + 0.3
        if st.killed_hung is not None:
            end.fate, end.seconds = HUNG, st.killed_hung
        elif st.pid is None:
            end.fate, end.why = NEVER_STARTED, "never started" + (f": {launch_error}" if launch_error else "")
        elif idle > watcher.timeout_s:
            end.fate, end.seconds = HUNG, idle
        elif first and code is not None and code != -signal.SIGTERM:
            end.fate, end.exit_code = EXITED, code
        else:
            # Stopped by the agent because another rank failed. An unknown exit code means the agent reaped it
            # while stopping the group (a rank that dies on its own is seen by the watcher, which polls ten times
            # as often as the agent's monitor).
            end.fate, end.seconds = STOPPED, idle
    result = JobResult(world_size=n, backend=backend, device="cuda" if backend == "nccl" else "cpu", iface=iface)
    return judge(ends, result, world_error=launch_error)
