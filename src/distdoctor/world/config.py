"""The world's configuration: the flags every world-starting command takes, checked before any rank starts, and
the choices that follow from them and from the machine (how many ranks, which backend, which interface).

Bad values raise InputError naming the flag. Nothing here starts a process or imports torch at module level.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
from dataclasses import dataclass

import click

from distdoctor.errors import InputError
from distdoctor.options import PORT, Number, seconds

BACKENDS = ("nccl", "gloo")
# A standalone world is local processes, each a Python with torch (~300 MB): more than this is a typo.
MAX_NPROC = 256


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


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_nproc(cfg: WorldConfig) -> int:
    from distdoctor.world.launchers import detect

    launch = detect()
    if launch is not None:
        return launch.world_size
    if cfg.nproc is not None:
        return cfg.nproc
    gpus = gpu_count()
    return gpus if gpus >= 2 else 4


def resolve_backend(cfg: WorldConfig, local_world_size: int) -> str:
    """NCCL with one GPU per local rank when there are enough GPUs, else gloo on CPU."""
    if cfg.backend:
        return cfg.backend
    import torch.distributed as dist

    if dist.is_nccl_available() and gpu_count() >= local_world_size >= 1:
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


def min_world(backend: str | None) -> int:
    """The smallest world worth starting: one rank on one GPU with --backend nccl (NCCL's own path and CUDA-event
    timing are what it checks there), else two."""
    return 1 if backend == "nccl" else 2


def config_from_options(nproc=None, timeout=60.0, backend=None, master_addr=None, master_port=None,
                        iface=None, **_ignored) -> WorldConfig:
    """Validate the world options; bad values raise InputError naming the flag."""
    from distdoctor.world.launchers import detect, is_local_address

    launch = detect()
    given = master_addr is not None
    master_addr = master_addr if given else "127.0.0.1"
    if nproc is not None and nproc < min_world(backend):
        raise InputError("--nproc", f"a world needs at least 2 ranks, got {nproc}"
                         + (" (one GPU is a world with --backend nccl)" if nproc == 1 else ""))
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
        local = (launch.local_world_size or launch.world_size) if launch else (nproc or max(gpu_count(), 2))
        if gpu_count() < local:
            raise InputError("--backend", f"nccl needs one GPU per local rank: {local} ranks, {gpu_count()} GPUs")
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
        click.option("--nproc", type=Number("ranks", None, MAX_NPROC, integer=True), default=None,
                     help="Standalone: number of local worker processes (default: #GPUs if >= 2, else 4)."),
        click.option("--timeout", type=seconds(), default=60.0, show_default=True,
                     help="Seconds every collective may take before the rank is declared lost."),
        click.option("--backend", type=click.Choice(BACKENDS), default=None,
                     help="Default: nccl with one GPU per rank when there are enough GPUs, else gloo on CPU."),
        click.option("--master-addr", default=None,
                     help="Rendezvous address. Standalone: an address of this host (default 127.0.0.1: loopback "
                          "unless you ask otherwise). Under srun/mpirun: rank 0's host (default: one node: none "
                          "needed; several: MASTER_ADDR, else the first host of the SLURM node list)."),
        click.option("--master-port", type=PORT, default=None,
                     help="Rendezvous port. Standalone default: a free one. Under srun/mpirun: MASTER_PORT, else "
                          "one derived from the job id."),
        click.option("--iface", default=None,
                     help="Network interface for gloo (GLOO_SOCKET_IFNAME); default: the one that routes to the "
                          "master."),
    ]
    for option in reversed(options):
        f = option(f)
    return f

