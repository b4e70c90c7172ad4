"""A running job's evidence, read from every rank through torch's control plane (no file is shared or read).

The job's TCPStore (MASTER_ADDR:MASTER_PORT) says where each rank's worker server listens: `distdoctor_live/rank<R>`
(ranks the recorder serves, recorder/live.py) or torch's own `debug_server/rank<R>` (a job that called
`torch.distributed.debug.start_debug_server`). One poll asks every rank at once (asyncio, at most CONCURRENCY
requests in flight, each bounded by `timeout`, the whole poll by `timeout` x rounds):

- `distdoctor_state`: the rank's compact state (progress per group, active entries, hang episode, pg_status);
- where that does not answer in time — its Python is busy (the GIL held) or the rank serves no distdoctor state —
  `fr_trace_json` (Flight Recorder, answered by C++ without the GIL) and, on request, `pyspy_dump` (py-spy reads
  the stacks from outside the process);
- a rank that answers nothing is reported as not answering, with the reason; it is never waited on.

`traceset` turns the answers into the one trace model through trace's loaders (each answer is what a dump file
would hold, written to a private temporary directory on the watcher's host and read by `load_traces`), so
diagnose's analysis, unchanged, gives the verdict.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from distdoctor.errors import InputError
from distdoctor.trace import model

PREFIX, TORCH_PREFIX, HANDLER = model.LIVE_PREFIX, model.TORCH_DEBUG_PREFIX, model.LIVE_HANDLER
CONCURRENCY = 256
# Requests in flight to one server at most: a worker server accepts with a short backlog and few threads, and a
# burst beyond them is answered only after TCP's SYN retransmits (1 s, 3 s): a server answering for many ranks
# (a test rig; in a job each rank has its own) is asked a few at a time.
PER_SERVER = 4
MAX_BODY = 8 << 20  # a Flight Recorder JSON of the largest buffer fits; more is refused, never buffered
STORE_TIMEOUT_S = 5.0


@dataclass
class Rank:
    rank: int
    url: str | None = None  # http://host:port of its worker server
    host: str | None = None
    pid: int | None = None
    served: bool = False  # registered by distdoctor's recorder (serves distdoctor_state)


@dataclass
class Answer:
    rank: int
    state: dict | None = None  # distdoctor_state
    fr: bytes | None = None  # Flight Recorder JSON, when the state did not come
    stack: str | None = None  # py-spy's text
    error: str | None = None  # why the state did not come
    fr_error: str | None = None
    seconds: float = 0.0
    nbytes: int = 0

    @property
    def python_silent(self) -> bool:
        """Alive (C++ answered) but its Python did not: the GIL is held, or the interpreter is stuck."""
        return self.state is None and self.fr is not None

    @property
    def silent(self) -> bool:
        return self.state is None and self.fr is None


@dataclass
class Job:
    addr: str
    port: int
    world_size: int
    ranks: dict[int, Rank] = field(default_factory=dict)


# ---- the store -------------------------------------------------------------------------------------------------

def parse_endpoint(text: str, name: str = "--live") -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(name, f"{text!r} is not HOST:PORT (the job's MASTER_ADDR:MASTER_PORT)")
    return host, int(port)


def connect(addr: str, port: int, timeout: float = STORE_TIMEOUT_S):
    import socket

    try:  # first a plain connect: a wrong endpoint is then one line, not torch's retries logged in C++
        socket.create_connection((addr, port), timeout=timeout).close()
    except OSError as exc:
        raise InputError(f"{addr}:{port}", f"no job store answers there ({exc.strerror or exc})") from None
    from torch.distributed import TCPStore

    try:
        return TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=timeout),
                        wait_for_workers=False)
    except Exception as exc:  # RuntimeError / DistNetworkError: one line, the endpoint named
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"{addr}:{port}", f"no job store answers there ({reason[:200]})") from None


def discover(store, addr: str, port: int, world_size: int | None = None) -> Job:
    """Who serves what: world size (distdoctor's key, else `world_size`, else the registered ranks counted) and
    every registered rank's worker-server address."""
    if world_size is None and store.check([f"{PREFIX}world_size"]):
        world_size = int(store.get(f"{PREFIX}world_size"))
    if world_size is None:
        world_size = _count(store, f"{PREFIX}rank") or _count(store, f"{TORCH_PREFIX}rank")
    if not world_size:
        raise InputError(f"{addr}:{port}", "no rank registered a debug server in this store (start the job "
                                            "under `distdoctor run`, or call torch.distributed.debug."
                                            "start_debug_server in every rank)")
    job = Job(addr, port, world_size)
    refresh(store, job)
    return job


def refresh(store, job: Job) -> None:
    """Learn the address of every rank not known yet (a rank registers once its process group exists)."""
    todo = [r for r in range(job.world_size) if job.ranks.get(r) is None or job.ranks[r].url is None]
    for prefix in (PREFIX, TORCH_PREFIX):
        present = _present(store, [f"{prefix}rank{r}" for r in todo])
        if present:
            values = store.multi_get(present)
            for key, raw in zip(present, values):
                r = int(key[len(prefix) + 4:])
                job.ranks[r] = _rank_of(r, raw.decode(errors="replace"), prefix == PREFIX)
        todo = [r for r in todo if r not in job.ranks]


def _rank_of(rank: int, raw: str, served: bool) -> Rank:
    if served:
        try:
            entry = json.loads(raw)
            return Rank(rank, str(entry["url"]), entry.get("host"), entry.get("pid"), True)
        except (ValueError, KeyError, TypeError):
            return Rank(rank)
    return Rank(rank, raw.strip(), urlsplit(raw.strip()).hostname)


def _present(store, keys: list[str]) -> list[str]:
    """The keys that exist, with few round trips (check() is true only when all of its keys exist)."""
    if not keys:
        return []
    if store.check(keys):
        return keys
    if len(keys) == 1:
        return []
    mid = len(keys) // 2
    return _present(store, keys[:mid]) + _present(store, keys[mid:])


def _count(store, prefix: str) -> int:
    """How many of rank0, rank1, ... exist in a row (galloping, then bisection)."""
    if not store.check([f"{prefix}0"]):
        return 0
    lo, hi = 1, 2
    while store.check([f"{prefix}{hi - 1}"]) and hi < (1 << 21):
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi) // 2
        if store.check([f"{prefix}{mid}"]):
            lo = mid + 1
        else:
            hi = mid
    return lo


# ---- one poll --------------------------------------------------------------------------------------------------

def poll(job: Job, stacks: bool = False, timeout: float = 2.0, pyspy: bool = False,
         only: set[int] | None = None) -> dict[int, Answer]:
    """Ask every registered rank (or those in `only`) for its state at once; see the module docstring."""
    ranks = [r for r in sorted(job.ranks.values()
                               if only is None else (job.ranks[x] for x in only if x in job.ranks),
                               key=lambda x: x.rank) if r.url]
    return asyncio.run(_poll(ranks, stacks, timeout, pyspy))


async def _poll(ranks: list[Rank], stacks: bool, timeout: float, pyspy: bool) -> dict[int, Answer]:
    gate = asyncio.Semaphore(CONCURRENCY)
    servers: dict[str, asyncio.Semaphore] = {}
    query = "?stacks=1" if stacks else ""

    async def one(r: Rank) -> Answer:
        netloc = urlsplit(r.url).netloc
        async with servers.setdefault(netloc, asyncio.Semaphore(PER_SERVER)):
            return await ask(r)

    async def ask(r: Rank) -> Answer:
        t0 = time.monotonic()
        ans = Answer(r.rank)
        if r.served:
            status, body, err = await _post(gate, r.url, f"/handler/{HANDLER}{query}", timeout)
            ans.nbytes += len(body or b"")
            if status == 200:
                try:
                    ans.state = json.loads(body)
                except ValueError:
                    ans.error = "answered with a body that is not JSON"
            else:
                ans.error = err or f"HTTP {status}: {(body or b'')[:200].decode(errors='replace')}"
        if ans.state is None:
            status, body, err = await _post(gate, r.url, "/handler/fr_trace_json", timeout)
            ans.nbytes += len(body or b"")
            if status == 200:
                ans.fr = body
            else:
                ans.fr_error = err or f"HTTP {status}"
            if pyspy and ans.fr is not None:
                status, body, err = await _post(gate, r.url, "/handler/pyspy_dump", max(timeout, 10.0))
                if status == 200 and body:
                    ans.stack = body.decode(errors="replace")
        ans.seconds = time.monotonic() - t0
        return ans

    answers = await asyncio.gather(*(one(r) for r in ranks))
    return {a.rank: a for a in answers}


async def _post(gate: asyncio.Semaphore, url: str, path: str, timeout: float) -> tuple[int, bytes | None, str | None]:
    """One POST (torch's worker server answers POST and GET); (status, body, error). Never raises."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or 80
    if parts.query:  # a server answering for several ranks names the rank in its registered URL's query
        path += ("&" if "?" in path else "?") + parts.query
    async with gate:
        try:
            return await asyncio.wait_for(_exchange(host, port, path), timeout)
        except asyncio.TimeoutError:
            return 0, None, f"no answer within {timeout:g} s"
        except (OSError, ValueError) as exc:
            return 0, None, f"{type(exc).__name__}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"


async def _exchange(host: str, port: int, path: str) -> tuple[int, bytes, None]:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n".encode())
        data = bytearray()
        while True:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            data += chunk
            if len(data) > MAX_BODY:
                raise ValueError(f"answer larger than {MAX_BODY >> 20} MiB")
    finally:
        writer.close()
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    first = lines[0].split()
    if len(first) < 2 or not first[1].isdigit():
        raise ValueError("the connection closed without an HTTP answer")
    status = int(first[1])
    if any(ln.lower().startswith(b"transfer-encoding:") and b"chunked" in ln.lower() for ln in lines[1:]):
        body = _unchunk(body)
    return status, body, None


def _unchunk(body: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        end = body.index(b"\r\n", i)
        size = int(body[i:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2:end + 2 + size]
        i = end + 2 + size + 2


# ---- the trace model -------------------------------------------------------------------------------------------

def traceset(job: Job, answers: dict[int, Answer]):
    """The answers as one TraceSet, read by trace's loaders exactly as diagnose reads dump files."""
    from distdoctor.trace.loaders import load_traces

    # 0700: private to the watcher; in memory where the system has a tmpfs (creating 16 384 files on a disk-backed
    # /tmp took 3.4 s per 4096 here)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tmp = tempfile.mkdtemp(prefix="distdoctor-live-", dir=shm)
    try:
        for rank, a in answers.items():
            if a.state is not None and isinstance(a.state.get("trace"), str):
                _write(os.path.join(tmp, f"rank_{rank}.jsonl"), a.state["trace"].encode())
            elif a.fr is not None:
                _write(os.path.join(tmp, f"rank_{rank}.fr.json"), a.fr)
        ts = load_traces([tmp], world_size=job.world_size, jobs=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for trace in ts.ranks.values():
        trace.path = f"live:{job.ranks[trace.rank].url if trace.rank in job.ranks else '?'}#rank{trace.rank}"
    return ts


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
