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

The standalone machinery is in `_standalone.py`, the launcher side in `_launched.py`; both return the
JobResult defined here. How a lost rank is named is explained there and in docs/world.md.

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
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import click

from distdoctor.errors import InputError

BACKENDS = ("nccl", "gloo")
# Substrings of errors a rank raises only because a peer is gone or late: such a rank is a victim, not a cause.
_COMM_ERROR_MARKS = (
    "timed out", "timeout", "connection closed", "connection reset", "closed by peer", "broken pipe",
    "connection refused", "unreachable", "no route to host", "network is down", "terminated by the launcher",
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
    master_port: int | None = None  # None: a free port (standalone) / the launcher's or a derived one
    iface: str | None = None  # network interface for gloo (GLOO_SOCKET_IFNAME)
    master_addr_given: bool = False  # --master-addr was given (under srun/mpirun it overrides the node list)


def under_launcher() -> bool:
    """True when an outside launcher (torchrun, srun, mpirun) already made this process a rank."""
    from distdoctor.world.launchers import detect

    return detect() is not None


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_nproc(cfg: WorldConfig) -> int:
    from distdoctor.world.launchers import detect

    launch = detect()
    if launch is not None:
        return launch.world_size
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


def _route_source(target: str) -> str | None:
    """The local address the kernel would send from to reach `target` (UDP connect sends nothing)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(target), 9))
            return s.getsockname()[0]
    except OSError:
        return None


def pick_iface(master_addr: str, multi_host: bool = False) -> str | None:
    """The interface whose address routes to the master (what gloo should bind), by asking the kernel.

    A master name that resolves to loopback on its own host (Debian's 127.0.1.1 line in /etc/hosts) would make
    gloo bind loopback, which other hosts cannot reach: for a multi-host world take the default route's
    interface instead."""
    local = _route_source(master_addr)
    if multi_host and (local is None or local.startswith("127.")):
        local = _route_source("192.0.2.1")  # TEST-NET-1: only the default route is looked up
    if local is None:
        return None
    for name in interfaces():
        if interface_address(name) == local:
            return name
    return None


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def config_from_options(nproc=None, timeout=60.0, backend=None, master_addr=None, master_port=None,
                        iface=None, **_ignored) -> WorldConfig:
    """Validate the world options; bad values raise InputError naming the flag."""
    from distdoctor.world.launchers import detect, is_local_address

    launch = detect()
    given = master_addr is not None
    master_addr = master_addr if given else "127.0.0.1"
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
        local = (launch.local_world_size or launch.world_size) if launch else (nproc or max(_gpu_count(), 2))
        if _gpu_count() < local:
            raise InputError("--backend", f"nccl needs one GPU per local rank: {local} ranks, {_gpu_count()} GPUs")
    try:
        socket.gethostbyname(master_addr)
    except OSError:
        raise InputError("--master-addr", f"cannot resolve {master_addr!r}") from None
    if launch is not None and launch.kind in ("torchrun", "env") and (given or master_port is not None):
        flag = "--master-addr" if given else "--master-port"
        raise InputError(flag, f"under {launch.describe()} the rendezvous is the launcher's (MASTER_ADDR="
                               f"{os.environ.get('MASTER_ADDR', '?')}): give it to the launcher, not to distdoctor")
    if launch is None and given and not is_local_address(master_addr):
        # The standalone world's store runs in this process: an address of another host can never be reached.
        raise InputError("--master-addr", f"{master_addr} is not an address of this host; a standalone world "
                                          "(no launcher) meets on this host (default 127.0.0.1)")
    if launch is None and master_port is not None and not _port_free(master_addr, master_port):
        raise InputError("--master-port", f"port {master_port} on {master_addr} is in use")
    return WorldConfig(nproc=nproc, backend=backend, timeout_s=float(timeout), master_addr=master_addr,
                       master_port=master_port, iface=iface, master_addr_given=given)


def _port_free(addr: str, port: int) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((socket.gethostbyname(addr), port))
        return True
    except OSError:
        return False


def world_options(f):
    """Click options for the world: --nproc, --timeout, --backend, --master-addr, --master-port, --iface."""
    options = [
        click.option("--nproc", type=int, default=None,
                     help="Standalone: number of local worker processes (default: #GPUs if >= 2, else 4)."),
        click.option("--timeout", type=float, default=60.0, show_default=True,
                     help="Seconds every collective may take before the rank is declared lost."),
        click.option("--backend", type=click.Choice(BACKENDS), default=None,
                     help="Default: nccl with one GPU per rank when there are enough GPUs, else gloo on CPU."),
        click.option("--master-addr", default=None,
                     help="Rendezvous address. Standalone: an address of this host (default 127.0.0.1: loopback "
                          "unless you ask otherwise). Under srun/mpirun: rank 0's host (default: one node: none "
                          "needed; several: MASTER_ADDR, else the first host of the SLURM node list)."),
        click.option("--master-port", type=int, default=None,
                     help="Rendezvous port. Standalone default: a free one. Under srun/mpirun: MASTER_PORT, else "
                          "one derived from the job id."),
        click.option("--iface", default=None,
                     help="Network interface for gloo (GLOO_SOCKET_IFNAME); default: the one that routes to the "
                          "master."),
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


def _init_process_group(backend: str, timeout_s: float, iface: str | None, store_path: str | None = None):
    """Join the world. With `store_path`, the ranks meet through a FileStore there (one host, nothing listening
    on the network); otherwise through the launcher's environment (MASTER_ADDR/MASTER_PORT, a TCPStore)."""
    import torch
    import torch.distributed as dist

    if iface and backend == "gloo":
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(seconds=timeout_s)
    join: dict = {"timeout": timeout}
    if store_path:
        world_size = int(os.environ["WORLD_SIZE"])
        join.update(store=dist.FileStore(store_path, world_size), rank=int(os.environ["RANK"]), world_size=world_size)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **join)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", **join)
    return device, timeout, local_rank


def _describe_exception(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:500]


def is_comm_error(message: str) -> bool:
    low = message.lower()
    return any(mark in low for mark in _COMM_ERROR_MARKS)


# ----------------------------------------------------------------------------------------------------------
# Under an existing launcher
# ----------------------------------------------------------------------------------------------------------

def run_job(target: str, args: dict, cfg: WorldConfig, on_event: Callable[[dict], None] | None = None) -> JobResult:
    """Run `target(ctx, **args)` in every rank of a world; return what every rank computed and who was lost."""
    from distdoctor.world import launchers

    _load_target(target)  # fail early, in the caller, on a bad target
    launch = launchers.detect()
    if launch is not None:
        from distdoctor.world import launched

        store_path = None
        if launch.kind not in ("torchrun", "env"):  # srun / mpirun: nobody agreed a rendezvous yet
            rdzv = launchers.rendezvous(launch, cfg.master_addr if cfg.master_addr_given else None, cfg.master_port)
            launchers.preflight(launch, rdzv, cfg.timeout_s)
            launchers.export(launch, rdzv)
            store_path = rdzv.store_path
        return launched.run_in_rank(target, args, cfg, on_event, store_path=store_path,
                                     store_in_rank0=launch.kind not in ("torchrun", "env") and store_path is None)
    from distdoctor.world import standalone

    return standalone.run_standalone(target, args, cfg, on_event)
