"""Which launcher started this process, and how its ranks meet without torchrun.

`detect()` reads the environment a launcher leaves in each rank:

| launcher | rank / world size / local rank | told apart by |
|---|---|---|
| torchrun (or any launcher that sets torch's variables) | RANK, WORLD_SIZE, LOCAL_RANK | RANK and WORLD_SIZE set |
| OpenMPI `mpirun` | OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK (_LOCAL_SIZE) | OMPI_COMM_WORLD_RANK set |
| MPICH / Intel MPI (Hydra) `mpiexec` | PMI_RANK, PMI_SIZE, MPI_LOCALRANKID (MPI_LOCALNRANKS) | PMI_RANK set |
| SLURM `srun` | SLURM_PROCID, SLURM_STEP_NUM_TASKS (SLURM_NTASKS), SLURM_LOCALID | SLURM_STEP_ID of a real step |

MPI comes before SLURM: `mpirun` inside an allocation inherits the batch script's SLURM_PROCID=0 in every rank.
The batch script itself (SLURM_PROCID=0, SLURM_NTASKS=N, no step) is not a world: run there, distdoctor starts
its own. A "world" of one task is not one either.

torchrun's agent already agreed a rendezvous (MASTER_ADDR/MASTER_PORT, its store). Under srun and mpirun nothing
did, so `rendezvous()` decides, identically on every rank:

- all ranks on one node (and no address given): a FileStore in a private per-user directory, named after the
  job id: nothing listens on the network (the rule for local worlds);
- otherwise a TCPStore served by rank 0 at (address, port): the address is --master-addr, else MASTER_ADDR,
  else the first host of the SLURM node list (srun puts task 0 on it); the port is --master-port, else
  MASTER_PORT, else one derived from the job id (PORT_BASE + crc32(job id) % PORT_SPAN), the same on every
  rank and different between jobs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import socket
import tempfile
import time
import zlib
from dataclasses import dataclass, field

from distdoctor.errors import InputError

KINDS = ("torchrun", "env", "openmpi", "mpich", "slurm")
PORT_BASE, PORT_SPAN = 20000, 10000  # below Linux's ephemeral range (32768-60999)
# SLURM's special step ids: the batch script, the extern step and an interactive step are not `srun` worlds.
_NOT_SRUN_STEPS = {"4294967293", "4294967294", "4294967295", "batch", "extern", "interactive"}


@dataclass(frozen=True)
class Launch:
    kind: str  # one of KINDS
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None = None  # None: the launcher does not say
    node_rank: int | None = None
    nnodes: int | None = None
    job_id: str | None = None  # the same in every rank of one job, different between jobs
    nodelist: tuple[str, ...] = field(default=())  # SLURM's hosts, expanded, in order
    nodelist_var: str | None = None

    @property
    def single_node(self) -> bool:
        return self.nnodes == 1 or self.local_world_size == self.world_size

    def describe(self) -> str:
        names = {"torchrun": "torchrun", "env": "a launcher that sets RANK/WORLD_SIZE", "openmpi": "OpenMPI mpirun",
                 "mpich": "MPICH/Hydra mpiexec", "slurm": "SLURM srun"}
        local = f", local rank {self.local_rank}" + (f" of {self.local_world_size}" if self.local_world_size else "")
        return f"{names[self.kind]} (rank {self.rank} of {self.world_size}{local})"

    def to_json(self) -> dict:
        return {"kind": self.kind, "rank": self.rank, "world_size": self.world_size, "local_rank": self.local_rank,
                "local_world_size": self.local_world_size, "node_rank": self.node_rank, "nnodes": self.nnodes,
                "job_id": self.job_id, "first_host": self.nodelist[0] if self.nodelist else None}


# ---------------------------------------------------------------------------------------------- node lists
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(text: str) -> list[str]:
    """SLURM's compressed host list, expanded in order: `gpu[01-04,07],login1` -> gpu01..gpu04, gpu07, login1.

    Grammar (scontrol show hostnames): entries separated by commas outside brackets; an entry is a name with
    any number of bracket groups, each a comma list of numbers or ranges `lo-hi`; a range keeps the zero
    padding of its lower bound (`[08-11]` -> 08 09 10 11); several groups multiply (`r[1-2]n[1-2]` -> r1n1 r1n2
    r2n1 r2n2). Raises ValueError naming what is wrong."""
    hosts: list[str] = []
    for entry in _split_outside_brackets(text.strip()):
        if entry:
            hosts.extend(_expand_entry(entry))
    if not hosts:
        raise ValueError("empty node list")
    return hosts


def _split_outside_brackets(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' at position {i} in {text!r}")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"']' without '[' at position {i} in {text!r}")
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise ValueError(f"unclosed '[' in {text!r}")
    parts.append(text[start:].strip())
    return parts


def _expand_entry(entry: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", entry)
    if m is None:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", entry):
            raise ValueError(f"host {entry!r} has characters a host name cannot have")
        return [entry]
    head, tail = entry[:m.start()], entry[m.end():]
    out = []
    for number in _expand_range(m.group(1), entry):
        out.extend(_expand_entry(head + number + tail))
    return out


def _expand_range(body: str, entry: str) -> list[str]:
    numbers = []
    for part in body.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise ValueError(f"{part.strip()!r} in {entry!r} is not a number or a range lo-hi")
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ValueError(f"range {part.strip()!r} in {entry!r} runs backwards")
        if hi - lo >= 1_000_000:
            raise ValueError(f"range {part.strip()!r} in {entry!r} is too long to be a list of hosts")
        width = len(lo_text)
        numbers.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return numbers


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE: `2(x3),1` -> [2, 2, 2, 1]."""
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ValueError(f"{part!r} is not N or N(xM)")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


# ---------------------------------------------------------------------------------------------- detection
def _int(env, name: str) -> int | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise InputError(name, f"the launcher set it to {value!r}, not an integer") from None


def detect(env=None) -> Launch | None:
    """The launcher this process runs under, or None (standalone: distdoctor starts its own world)."""
    env = os.environ if env is None else env
    forced = env.get("DISTDOCTOR_LAUNCHER")  # set when this process exported torch's variables itself
    if "RANK" in env and "WORLD_SIZE" in env and forced not in ("openmpi", "mpich", "slurm"):
        kind = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "env"
        return Launch(kind, _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK") or 0,
                      _int(env, "LOCAL_WORLD_SIZE"), _int(env, "GROUP_RANK"), None, env.get("TORCHELASTIC_RUN_ID"))
    slurm = _slurm_nodes(env)
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        job = env.get("OMPI_MCA_ess_base_jobid") or env.get("PMIX_NAMESPACE") or _slurm_job(env)
        launch = Launch("openmpi", _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE"),
                        _int(env, "OMPI_COMM_WORLD_LOCAL_RANK") or 0, _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE"),
                        None, _int(env, "OMPI_MCA_orte_num_nodes"), job, *slurm)
    elif "PMI_RANK" in env and "PMI_SIZE" in env:
        job = env.get("PMI_KVSNAME") or env.get("PMI_JOBID") or _slurm_job(env)
        launch = Launch("mpich", _int(env, "PMI_RANK"), _int(env, "PMI_SIZE"), _int(env, "MPI_LOCALRANKID") or 0,
                        _int(env, "MPI_LOCALNRANKS"), None, None, job, *slurm)
    elif "SLURM_PROCID" in env and env.get("SLURM_STEP_ID", env.get("SLURM_STEPID")) not in (None, *_NOT_SRUN_STEPS):
        size = _int(env, "SLURM_STEP_NUM_TASKS") or _int(env, "SLURM_NTASKS") or _int(env, "SLURM_NPROCS")
        node = _int(env, "SLURM_NODEID")
        per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
        local_size = None
        if per_node and node is not None:
            try:
                counts = expand_tasks_per_node(per_node)
            except ValueError as exc:
                raise InputError("SLURM_STEP_TASKS_PER_NODE", str(exc)) from None
            local_size = counts[node] if node < len(counts) else None
        nnodes = _int(env, "SLURM_STEP_NUM_NODES") or _int(env, "SLURM_NNODES")
        launch = Launch("slurm", _int(env, "SLURM_PROCID"), size or 1, _int(env, "SLURM_LOCALID") or 0, local_size,
                        node, nnodes, _slurm_job(env), *slurm)
    else:
        return None
    if launch.world_size is None or launch.world_size < 2:
        return None  # one task: not a world; distdoctor starts its own
    if not 0 <= launch.rank < launch.world_size:
        raise InputError(f"{launch.kind} rank", f"rank {launch.rank} is outside a world of {launch.world_size}")
    if launch.node_rank is None and launch.single_node:
        launch = dataclasses.replace(launch, node_rank=0)
    return launch


def _slurm_job(env) -> str | None:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job is None:
        return None
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return f"{job}.{step}" if step is not None else job


def _slurm_nodes(env) -> tuple[tuple[str, ...], str | None]:
    """(hosts, the variable they came from): the step's node list first (rank 0 runs on its first host)."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if env.get(name):
            try:
                return tuple(expand_nodelist(env[name])), name
            except ValueError as exc:
                raise InputError(name, str(exc)) from None
    return (), None


# ---------------------------------------------------------------------------------------------- rendezvous
@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of an srun/mpirun world meet: a FileStore path, or rank 0's TCPStore (addr, port)."""
    store_path: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    source: str = ""  # how the address and port were chosen, for messages and `distdoctor env`

    def describe(self) -> str:
        if self.store_path:
            return f"a file store on this node ({self.source})"
        return f"rank 0 at {self.master_addr}:{self.master_port} ({self.source})"


def derived_port(job_id: str) -> int:
    return PORT_BASE + zlib.crc32(job_id.encode()) % PORT_SPAN


def rendezvous(launch: Launch, master_addr: str | None, master_port: int | None, env=None) -> Rendezvous:
    """Decide, identically on every rank, where the ranks meet (see the module docstring)."""
    env = os.environ if env is None else env
    addr, addr_from = (master_addr, "--master-addr") if master_addr else (env.get("MASTER_ADDR"), "MASTER_ADDR")
    if not addr and launch.single_node:
        return Rendezvous(store_path=local_store_path(launch),
                          source=f"all {launch.world_size} ranks on one node, job {launch.job_id or '?'}")
    if not addr and launch.nodelist:
        addr, addr_from = launch.nodelist[0], f"first host of {launch.nodelist_var}"
    if not addr:
        raise InputError("--master-addr", f"{launch.world_size} ranks on several nodes under {launch.kind} and "
                                          "nothing names rank 0's host: pass --master-addr HOST (or set "
                                          "MASTER_ADDR) on every rank")
    if master_port:
        port, port_from = master_port, "--master-port"
    elif env.get("MASTER_PORT"):
        port, port_from = _int(env, "MASTER_PORT"), "MASTER_PORT"
    elif launch.job_id:
        port, port_from = derived_port(launch.job_id), f"derived from job {launch.job_id}"
    else:
        raise InputError("--master-port", f"no job id under {launch.kind} to derive a port from: pass "
                                          "--master-port PORT (or set MASTER_PORT) on every rank")
    return Rendezvous(master_addr=addr, master_port=port, source=f"address from {addr_from}, port {port_from}")


def _start_time(pid: int) -> str | None:
    """The start time of a process (clock ticks since boot, /proc/<pid>/stat field 22): with the pid, unique."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def local_store_path(launch: Launch) -> str:
    """The file store of a one-node world. On one node every rank is a child of the same launcher process (mpirun,
    the Hydra proxy, slurmstepd): its pid and start time make the name unique, so no stale file of an earlier job
    is ever reused. Stores of launchers that are gone are removed first."""
    directory = private_dir()
    for name in os.listdir(directory):
        m = re.fullmatch(r".*-p(\d+)-t(\d+)\.store", name)
        if m and _start_time(int(m.group(1))) != m.group(2):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))
    ppid = os.getppid()
    return os.path.join(directory, f"{launch.kind}-{_safe(launch.job_id or 'job')}-p{ppid}-t{_start_time(ppid)}.store")


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)[:100]


def private_dir() -> str:
    """A directory only this user can enter (the file stores of local worlds live there)."""
    path = os.path.join(tempfile.gettempdir(), f"distdoctor-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise InputError(path, "exists but is not a private directory of this user; remove it")
    return path


def is_local_address(addr: str) -> bool:
    """True when this host owns `addr` (a socket can bind it)."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((sockaddr[0], 0))
                return True
        except OSError:
            continue
    return False


def preflight(launch: Launch, rdzv: Rendezvous, timeout_s: float) -> None:
    """Fail in one line, within the timeout, where torch would retry for minutes and print C++ frames:
    rank 0 must own the master address and find the port free; the others must reach it."""
    if rdzv.store_path:
        return
    addr, port = rdzv.master_addr, rdzv.master_port
    if launch.rank == 0:
        if not is_local_address(addr):
            raise InputError("--master-addr", f"rank 0 runs on {socket.gethostname()}, which does not own {addr} "
                                              f"({rdzv.source}): give an address of rank 0's host")
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", port))
        except OSError as exc:
            raise InputError("--master-port", f"port {port} on {socket.gethostname()} is not free ({exc.strerror}; "
                                              f"{rdzv.source}): pass another --master-port") from None
        return
    deadline = time.monotonic() + timeout_s
    last = "no attempt"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((addr, port), timeout=min(2.0, max(0.1, deadline - time.monotonic()))):
                return
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        time.sleep(0.2)
    raise InputError("--master-addr", f"rank {launch.rank} on {socket.gethostname()} cannot reach rank 0's "
                                      f"rendezvous at {addr}:{port} within {timeout_s:g} s ({last}; {rdzv.source})")


def export(launch: Launch, rdzv: Rendezvous) -> None:
    """Set torch's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
    MASTER_PORT) from the launcher's, so the rest runs as under torchrun."""
    local_size = launch.world_size if launch.single_node else launch.local_world_size
    values = {"RANK": launch.rank, "WORLD_SIZE": launch.world_size, "LOCAL_RANK": launch.local_rank,
              "LOCAL_WORLD_SIZE": local_size, "GROUP_RANK": launch.node_rank, "MASTER_ADDR": rdzv.master_addr,
              "MASTER_PORT": rdzv.master_port, "DISTDOCTOR_LAUNCHER": launch.kind}
    for key, value in values.items():
        if value is not None:
            os.environ[key] = str(value)
