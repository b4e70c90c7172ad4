"""Get a world of ranks, run one function in every rank, and bring back what each rank computed.

Two ways to get a world, one code path after it:

- standalone (no RANK/WORLD_SIZE in the environment): start `nproc` local workers with torch's own elastic
  launcher (`torch.distributed.launcher.api.elastic_launch`, c10d rendezvous on 127.0.0.1 and a free port,
  max_restarts=0). The parent process is the reporter. Each worker streams what it does to its own append-only
  file in a private run directory (its phase, `ctx.emit` records, progress); a file survives the worker's hard
  death, so nothing computed is lost and the parent can say what a dead rank was doing.
- under an existing launcher (`torchrun … -m distdoctor validate`): this process is one rank. Phases, records,
  a heartbeat and the final result go to the process group's store (the launcher's TCPStore), which outlives
  any single worker; rank 0 gathers from it under the timeout and is the only reporter. If rank 0 is gone, the
  lowest surviving rank reports instead.

How a lost rank is named (standalone): a rank with no result is lost when it died on its own (its exit code),
when it made no progress for `timeout_s` while another rank had already finished or failed (it is killed and
reported as hung), or when its function raised something other than a communication error. Ranks that only
timed out or saw a peer close the connection are victims: their errors are kept in `errors`, and they are
reported as lost only when no rank explains the failure (e.g. every peer unreachable).

Guarantees: every collective of the harness and of the worker function runs under `timeout_s` (the process
group timeout); survivors stop within timeout_s + 15 s; no worker outlives run_job (the elastic agent stops
the group on the first failure, and a watchdog here kills hung workers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import importlib
import json
import logging
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import click

from distdoctor.errors import InputError

BACKENDS = ("nccl", "gloo")
# Substrings of errors a rank raises only because a peer is gone or late: such a rank is a victim, not a cause.
_COMM_ERROR_MARKS = (
    "timed out", "timeout", "connection closed", "connection reset", "broken pipe", "connection refused",
    "socket", "peer", "gloo", "nccl", "unreachable", "no route", "enforcenotmet", "wait timeout",
)


# ----------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorldConfig:
    nproc: int | None = None  # standalone: local workers (None: #GPUs if >= 2 GPUs else 4)
    backend: str | None = None  # "nccl" | "gloo" | None = auto
    timeout_s: float = 60.0  # every collective runs under this timeout
    master_addr: str = "127.0.0.1"  # loopback unless the user asks otherwise
    master_port: int | None = None  # None: a free port
    iface: str | None = None  # network interface for gloo (GLOO_SOCKET_IFNAME)


def under_launcher() -> bool:
    """True when an outside launcher (torchrun, mpirun with env) already made this process a rank."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_nproc(cfg: WorldConfig) -> int:
    if under_launcher():
        return int(os.environ["WORLD_SIZE"])
    if cfg.nproc is not None:
        return cfg.nproc
    gpus = _gpu_count()
    return gpus if gpus >= 2 else 4


def resolve_backend(cfg: WorldConfig, local_world_size: int) -> str:
    """NCCL with one GPU per local rank when there are enough GPUs, else gloo on CPU."""
    if cfg.backend:
        return cfg.backend
    import torch.distributed as dist

    if dist.is_nccl_available() and _gpu_count() >= local_world_size >= 1:
        return "nccl"
    return "gloo"


def interfaces() -> list[str]:
    return [name for _, name in socket.if_nameindex()]


def interface_address(name: str) -> str | None:
    """IPv4 address of a network interface (SIOCGIFADDR), or None."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None


def pick_iface(master_addr: str) -> str | None:
    """The interface whose address routes to the master (what gloo should bind), by asking the kernel."""
    try:
        target = socket.gethostbyname(master_addr)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((target, 9))  # UDP connect sends nothing; it only picks the route
            local = s.getsockname()[0]
    except OSError:
        return None
    for name in interfaces():
        if interface_address(name) == local:
            return name
    return None


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def config_from_options(nproc=None, timeout=60.0, backend=None, master_addr="127.0.0.1", master_port=None,
                        iface=None, **_ignored) -> WorldConfig:
    """Validate the world options; bad values raise InputError naming the flag."""
    if nproc is not None and nproc < 2:
        raise InputError("--nproc", f"a world needs at least 2 ranks, got {nproc}")
    if timeout is None or not timeout > 0:
        raise InputError("--timeout", f"must be a positive number of seconds, got {timeout}")
    if master_port is not None and not 0 < master_port < 65536:
        raise InputError("--master-port", f"must be a TCP port (1-65535), got {master_port}")
    if iface is not None and iface not in interfaces():
        raise InputError("--iface", f"no network interface named {iface!r} (have: {', '.join(interfaces())})")
    if backend is not None and backend not in BACKENDS:
        raise InputError("--backend", f"must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "nccl":
        import torch.distributed as dist

        if not dist.is_nccl_available():
            raise InputError("--backend", "nccl is not available in this torch build")
        local = int(os.environ.get("LOCAL_WORLD_SIZE", nproc or max(_gpu_count(), 2)))
        if _gpu_count() < local:
            raise InputError("--backend", f"nccl needs one GPU per local rank: {local} ranks, {_gpu_count()} GPUs")
    try:
        socket.gethostbyname(master_addr)
    except OSError:
        raise InputError("--master-addr", f"cannot resolve {master_addr!r}") from None
    return WorldConfig(nproc=nproc, backend=backend, timeout_s=float(timeout), master_addr=master_addr,
                       master_port=master_port, iface=iface)


def world_options(f):
    """Click options for the world: --nproc, --timeout, --backend, --master-addr, --master-port, --iface."""
    options = [
        click.option("--nproc", type=int, default=None,
                     help="Standalone: number of local worker processes (default: #GPUs if >= 2, else 4)."),
        click.option("--timeout", type=float, default=60.0, show_default=True,
                     help="Seconds every collective may take before the rank is declared lost."),
        click.option("--backend", type=click.Choice(BACKENDS), default=None,
                     help="Default: nccl with one GPU per rank when there are enough GPUs, else gloo on CPU."),
        click.option("--master-addr", default="127.0.0.1", show_default=True,
                     help="Standalone rendezvous address (loopback unless you ask otherwise)."),
        click.option("--master-port", type=int, default=None, help="Standalone rendezvous port (default: a free one)."),
        click.option("--iface", default=None,
                     help="Network interface for gloo (GLOO_SOCKET_IFNAME); default: the one that routes to the master."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


# ----------------------------------------------------------------------------------------------------------
# Results
# ----------------------------------------------------------------------------------------------------------


@dataclass
class LostRank:
    rank: int
    host: str
    reason: str  # "exited with code -9" / "hung: no progress for 63 s" / "unreachable"
    in_op: str | None  # what the rank was doing (its last ctx.phase)

    def describe(self) -> str:
        where = f" in {self.in_op}" if self.in_op else ""
        return f"rank {self.rank} on {self.host} {self.reason}{where}"


@dataclass
class JobResult:
    world_size: int
    backend: str
    device: str  # "cpu" | "cuda"
    results: dict[int, Any] = field(default_factory=dict)
    records: dict[int, list] = field(default_factory=dict)
    lost: list[LostRank] = field(default_factory=list)
    ok: bool = True
    is_reporter: bool = True
    iface: str | None = None
    errors: dict[int, str] = field(default_factory=dict)  # ranks whose function raised (victims included)
    phases: dict[int, str | None] = field(default_factory=dict)  # each rank's last phase
    mode: str = "standalone"  # "standalone" | "launcher"
    wall_s: float = 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["results"] = {str(k): v for k, v in self.results.items()}
        d["records"] = {str(k): v for k, v in self.records.items()}
        d["errors"] = {str(k): v for k, v in self.errors.items()}
        d["phases"] = {str(k): v for k, v in self.phases.items()}
        return d


# ----------------------------------------------------------------------------------------------------------
# The worker side
# ----------------------------------------------------------------------------------------------------------


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


class WorkerContext:
    """What the worker function gets: its place in the world and a way to say what it is doing."""

    def __init__(self, rank, world_size, local_rank, backend, device, timeout, channel):
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.backend = backend
        self.device = device
        self.timeout = timeout
        self._channel = channel
        self._phases: list[str] = []
        self.failed_in: str | None = None  # the phase an exception escaped from
        self.stage: str | None = None  # a job made of parts (check: validate, then bench) names the part here

    @property
    def current_phase(self) -> str | None:
        return self._phases[-1] if self._phases else None

    @contextlib.contextmanager
    def phase(self, name: str):
        """Record what this rank is doing right now (e.g. "all_reduce float32 count=262144 group=world").

        Call it at least once per `timeout`: a rank whose phase does not change for longer is taken as hung
        once another rank has finished.
        """
        self._phases.append(name)
        self._channel.send({"type": "phase", "phase": name, "t": time.time()})
        try:
            yield
        except BaseException:
            if self.failed_in is None:  # the innermost phase the error came out of
                self.failed_in = name
            raise
        finally:
            self._phases.pop()
            self._channel.send({"type": "phase", "phase": self.current_phase, "t": time.time()})

    def emit(self, record: Any) -> None:
        """Stream a partial result (JSON-serializable) to the reporter; it is kept even if this rank dies."""
        self._channel.send({"type": "record", "record": record, "t": time.time()})

    def progress(self, done: int, total: int, what: str = "") -> None:
        self._channel.send({"type": "progress", "rank": self.rank, "done": done, "total": total, "what": what,
                            "stage": self.stage, "t": time.time()})

    def new_group(self, ranks: list[int]):
        """A subgroup under the world's timeout (every rank must call this, as with dist.new_group)."""
        import torch.distributed as dist

        return dist.new_group(ranks, timeout=self.timeout)


def _load_target(target: str) -> Callable:
    module_name, _, func_name = target.partition(":")
    if not module_name or not func_name:
        raise InputError("target", f"expected 'package.module:function', got {target!r}")
    try:
        return getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise InputError("target", f"cannot load {target!r}: {exc}") from None


def _init_process_group(backend: str, timeout_s: float, iface: str | None):
    import torch
    import torch.distributed as dist

    if iface and backend == "gloo":
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    return device, timeout, local_rank


def _describe_exception(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:500]


def is_comm_error(message: str) -> bool:
    low = message.lower()
    return any(mark in low for mark in _COMM_ERROR_MARKS)


def _standalone_worker(target: str, args: dict, backend: str, timeout_s: float, iface: str | None,
                       run_dir: str) -> None:
    """Entry point of one elastic worker process (module-level so it can be pickled for spawn)."""
    # Worker output must never reach the reporter's stdout (it may be a JSON document).
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # A forked worker inherits the agent's handlers (they raise SignalException): a stop request from the
    # agent must simply end the worker, as it would a spawned one.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    rank = int(os.environ["RANK"])
    channel = _FileChannel(run_dir, rank)
    channel.send({"type": "start", "pid": os.getpid(), "host": socket.gethostname(), "t": time.time()})
    ctx = None
    try:
        device, timeout, local_rank = _init_process_group(backend, timeout_s, iface)
        import torch.distributed as dist

        ctx = WorkerContext(rank, dist.get_world_size(), local_rank, backend, device, timeout, channel)
        value = _load_target(target)(ctx, **args)
        channel.done({"ok": True, "value": value})
    except BaseException as exc:  # noqa: BLE001 - everything a rank raises is reported, then the rank fails
        message = _describe_exception(exc)
        with contextlib.suppress(Exception):
            channel.done({"ok": False, "error": message, "phase": (ctx.failed_in or ctx.current_phase) if ctx else None,
                          "traceback": traceback.format_exc()[-4000:]})
        sys.stderr.flush()
        # A failing rank must exit non-zero so that the agent stops the group at once; os._exit skips
        # process-group teardown, which can itself block on a dead peer.
        os._exit(1)
    import torch.distributed as dist

    with contextlib.suppress(Exception):
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------------
# The reporter side, standalone
# ----------------------------------------------------------------------------------------------------------


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
            # could be waiting in has timed out by then), or silent far past any collective's timeout.
            if (first_end is not None and now - first_end > self.timeout_s and idle > self.timeout_s) or \
                    idle > self.timeout_s + 12:
                st.killed_hung = idle
                with contextlib.suppress(OSError):
                    os.kill(st.pid, signal.SIGKILL)
                st.ended_at = now

    def run(self) -> None:
        # Exits are polled faster than the agent's monitor (0.5 s) so that we, not it, see each exit code first.
        tick = 0
        while not self.stop_event.wait(0.05):
            tick += 1
            with contextlib.suppress(Exception):
                with self.lock:
                    self.poll_exits()
                if tick % 4 == 0:
                    self.poll()


def _quiet_elastic_logs():
    """torch elastic logs every launch at INFO and every failure at ERROR; the report says it better."""
    saved = {}
    for name in ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing", "torch.distributed.elastic.agent",
                 "torch.distributed.elastic.multiprocessing", "torch.distributed.elastic.rendezvous"):
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

    kw = dict(
        min_nodes=1, max_nodes=1, nproc_per_node=n, run_id=f"distdoctor-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d", rdzv_endpoint=f"{cfg.master_addr}:{port}",
        rdzv_configs={"timeout": int(max(cfg.timeout_s, 30)), "is_host": True}, max_restarts=0,
        monitor_interval=0.5, start_method=_start_method(backend), local_addr=cfg.master_addr,
        logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "logs")),
    )
    fields = {f.name for f in dataclasses.fields(LaunchConfig)}
    if "shutdown_timeout" in fields:
        kw["shutdown_timeout"] = 3  # a rank that ignores SIGTERM is SIGKILLed after 3 s, not 30
    return LaunchConfig(**kw)


def _standalone(target: str, args: dict, cfg: WorldConfig, on_event) -> JobResult:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    n = resolve_nproc(cfg)
    backend = resolve_backend(cfg, n)
    iface = cfg.iface
    if iface is None and backend == "gloo":
        iface = pick_iface(cfg.master_addr)  # loopback for 127.0.0.1: nothing listens beyond this machine
    port = cfg.master_port or free_port(cfg.master_addr)
    run_dir = Path(tempfile.mkdtemp(prefix="distdoctor-run-"))
    watcher = _Watcher(run_dir, n, cfg.timeout_s, on_event)
    start = time.time()
    failures: dict[int, Any] = {}
    launch_error: str | None = None
    saved = _quiet_elastic_logs()
    watcher.start()
    try:
        launch = elastic_launch(_launch_config(n, cfg, port, run_dir, backend), _standalone_worker)
        launch(target, args, backend, cfg.timeout_s, iface, str(run_dir))
    except ChildFailedError as exc:
        failures = dict(exc.failures)
    except Exception as exc:  # rendezvous or start-up failure: no world at all
        launch_error = _describe_exception(exc)
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


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "exited"
    if code < 0:
        try:
            return f"exited with code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"exited with code {code}"
    return f"exited with code {code}"


def _classify(watcher: _Watcher, n: int, backend: str, iface, failures: dict, launch_error) -> JobResult:
    ranks = watcher.ranks
    result = JobResult(world_size=n, backend=backend, device="cuda" if backend == "nccl" else "cpu", iface=iface)
    victims: list[int] = []
    ended = [st.ended_at for st in ranks if st.ended_at is not None]
    for rank, st in enumerate(ranks):
        result.records[rank] = st.records
        result.phases[rank] = st.phase
        outcome = st.outcome
        if outcome and outcome.get("ok"):
            result.results[rank] = outcome.get("value")
            continue
        in_op = (outcome or {}).get("phase") or st.phase
        if outcome is not None:  # the function raised
            result.errors[rank] = outcome["error"]
            if is_comm_error(outcome["error"]):
                victims.append(rank)
            else:
                result.lost.append(LostRank(rank, st.host, f"raised {outcome['error']}", in_op))
            continue
        if st.killed_hung is not None:
            result.lost.append(LostRank(rank, st.host, f"hung: no progress for {st.killed_hung:.0f} s", in_op))
            continue
        failure = failures.get(rank)
        code = st.exit_code if st.exit_code is not None else getattr(failure, "exitcode", None)
        idle = (st.ended_at or time.time()) - (st.last_activity or st.ended_at or time.time())
        first = st.ended_at is not None and st.ended_at <= min(ended) + 0.3
        if st.pid is None:
            result.lost.append(LostRank(rank, st.host, "never started" + (f": {launch_error}" if launch_error else ""), None))
        elif idle > watcher.timeout_s:
            result.lost.append(LostRank(rank, st.host, f"hung: no progress for {idle:.0f} s", in_op))
        elif first and code != -signal.SIGTERM:
            result.lost.append(LostRank(rank, st.host, _exit_reason(code), in_op))
        # else: stopped by the agent because another rank failed — collateral, not a cause.
    if not result.lost and victims:
        # Nobody explains the failure (every peer timed out or lost the connection): name them all.
        for rank in victims:
            st = ranks[rank]
            reason = "unreachable" if "timed out" not in result.errors[rank].lower() and \
                "timeout" not in result.errors[rank].lower() else "timed out waiting for peers"
            result.lost.append(LostRank(rank, st.host, f"{reason}: {result.errors[rank]}",
                                        ranks[rank].phase))
    if launch_error and not result.lost:
        result.lost.append(LostRank(0, socket.gethostname(), f"world did not start: {launch_error}", None))
    result.lost.sort(key=lambda lr: lr.rank)
    result.ok = len(result.results) == n and not result.lost and not result.errors
    return result


# ----------------------------------------------------------------------------------------------------------
# Under an existing launcher
# ----------------------------------------------------------------------------------------------------------

def run_job(target: str, args: dict, cfg: WorldConfig, on_event: Callable[[dict], None] | None = None) -> JobResult:
    """Run `target(ctx, **args)` in every rank of a world; return what every rank computed and who was lost."""
    _load_target(target)  # fail early, in the caller, on a bad target
    if under_launcher():
        from distdoctor import _launched

        return _launched.run_in_rank(target, args, cfg, on_event)
    return _standalone(target, args, cfg, on_event)
