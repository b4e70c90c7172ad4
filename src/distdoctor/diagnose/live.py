"""A running job's evidence, read from every rank through torch's control plane (no file is shared or read).

The job's TCPStore (MASTER_ADDR:MASTER_PORT) says where each rank's worker server listens: `distdoctor_live/rank<R>`
(ranks the recorder serves, recorder/live.py) or torch's own `debug_server/rank<R>` (a job that called
`torch.distributed.debug.start_debug_server`). One poll asks every rank at once (at most CONCURRENCY
requests in flight, PER_SERVER to one server, each bounded by `timeout`; fanin.py):

- `distdoctor_state`: the rank's compact state (progress per group, active entries, hang episode, pg_status);
- where that does not answer in time — its Python is busy (the GIL held) or the rank serves no distdoctor state —
  `fr_trace_json` (Flight Recorder, answered by C++ without the GIL) and, on request, `pyspy_dump` (py-spy reads
  the stacks from outside the process);
- a rank that answers nothing is reported as not answering, with the reason; it is never waited on.

`traceset` turns the answers into the one trace model through trace's loaders, in memory (each answer holds what
a dump file would, checked as a file is), so diagnose's analysis, unchanged, gives the verdict. `single_out`
names the ranks whose stacks the verdict needs, from the compact state alone.
"""

from __future__ import annotations

import datetime
import json
from collections import deque
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from distdoctor.diagnose import fanin
from distdoctor.errors import InputError
from distdoctor.trace import model

try:  # a declared dependency; the stdlib's reader stays as the fallback
    import orjson as _fastjson
except ImportError:  # pragma: no cover - depends on the environment
    _fastjson = None

PREFIX, TORCH_PREFIX, HANDLER = model.LIVE_PREFIX, model.TORCH_DEBUG_PREFIX, model.LIVE_HANDLER
CONCURRENCY = 256
# Requests in flight to one server at most: a worker server accepts with a short backlog and few threads, and a
# burst beyond them is answered only after TCP's SYN retransmits (1 s, 3 s): a server answering for many ranks
# (a test rig; in a job each rank has its own) is asked a few at a time.
PER_SERVER = 4
MAX_BODY = 8 << 20  # a Flight Recorder JSON of the largest buffer fits; more is refused, never buffered
STORE_TIMEOUT_S = 5.0
SEARCH_CHECKS = 256  # store round trips one refresh spends at most searching for ranks not registered yet


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
    listed = _registered(store)
    for prefix in (PREFIX, TORCH_PREFIX):
        keys = [f"{prefix}rank{r}" for r in todo]
        if prefix == PREFIX and listed is not None:  # the ranks that said they registered: no search
            keys = [f"{prefix}rank{r}" for r in todo if r in listed]
        # a search costs two round trips per key missing: bounded per refresh (a job still starting is looked
        # at again on the next poll)
        present = _present(store, keys, SEARCH_CHECKS)
        if present:
            values = store.multi_get(present)
            for key, raw in zip(present, values):
                r = int(key[len(prefix) + 4:])
                job.ranks[r] = _rank_of(r, raw.decode(errors="replace"), prefix == PREFIX)
        todo = [r for r in todo if r not in job.ranks]


def _registered(store) -> set[int] | None:
    """The ranks listed in `distdoctor_live/ranks` (each appends itself once registered), None where no rank
    lists itself (an older distdoctor): then the keys are searched."""
    if not store.check([model.LIVE_REGISTERED]):
        return None
    raw = store.get(model.LIVE_REGISTERED).decode(errors="replace")
    return {int(x) for x in raw.split(",") if x.strip().isdigit()}


def _rank_of(rank: int, raw: str, served: bool) -> Rank:
    if served:
        try:
            entry = json.loads(raw)
            return Rank(rank, str(entry["url"]), entry.get("host"), entry.get("pid"), True)
        except (ValueError, KeyError, TypeError):
            return Rank(rank)
    return Rank(rank, raw.strip(), urlsplit(raw.strip()).hostname)


def _present(store, keys: list[str], budget: int) -> list[str]:
    """The keys that exist, with few round trips (check() is true only when all of its keys exist): halves
    checked breadth first, at most `budget` checks (what was not reached is looked for on the next call)."""
    found, chunks = [], deque([keys] if keys else [])
    while chunks and budget > 0:
        chunk = chunks.popleft()
        budget -= 1
        if store.check(chunk):
            found.extend(chunk)
        elif len(chunk) > 1:
            mid = len(chunk) // 2
            chunks.extend((chunk[:mid], chunk[mid:]))
    return found


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

def poll(job: Job, stacks: bool | set[int] = False, timeout: float = 2.0, pyspy: bool = False,
         only: set[int] | None = None, full: bool = False) -> dict[int, Answer]:
    """Ask every registered rank (or those in `only`) for its state at once; see the module docstring. `full`:
    with its trace (active entries and frontiers, as one object); `stacks` (every rank, or the ranks in it): with
    the trace and its threads' stacks."""
    ranks = [r for r in sorted(job.ranks.values()
                               if only is None else (job.ranks[x] for x in only if x in job.ranks),
                               key=lambda x: x.rank) if r.url]

    def query(rank: int) -> str:
        if stacks is True or (stacks and rank in stacks):
            return "?stacks=1&form=object"
        return "?full=1&form=object" if full else ""

    from distdoctor.trace.loaders import gc_paused

    with gc_paused():  # 16 384 answers decoded: the collector would rescan them again and again
        return _poll(ranks, query, timeout, pyspy)


def _poll(ranks: list[Rank], query, timeout: float, pyspy: bool) -> dict[int, Answer]:
    answers = {r.rank: Answer(r.rank) for r in ranks}
    served = [r for r in ranks if r.served]
    asked = _fetch(served, [f"/handler/{HANDLER}{query(r.rank)}" for r in served], timeout)
    for r, (status, body, err) in zip(served, asked):
        ans = answers[r.rank]
        ans.nbytes += len(body or b"")
        if status == 200:
            ans.state = _decode(body)
            if ans.state is None:
                ans.error = "answered with a body that is not a JSON object"
        else:
            ans.error = err or f"HTTP {status}: {(body or b'')[:200].decode(errors='replace')}"
    quiet = [r for r in ranks if answers[r.rank].state is None]
    for r, (status, body, err) in zip(quiet, _fetch(quiet, ["/handler/fr_trace_json"] * len(quiet), timeout)):
        ans = answers[r.rank]
        ans.nbytes += len(body or b"")
        if status == 200:
            ans.fr = body
        else:
            ans.fr_error = err or f"HTTP {status}"
    alive = [r for r in quiet if answers[r.rank].fr is not None] if pyspy else []
    for r, (status, body, _) in zip(alive, _fetch(alive, ["/handler/pyspy_dump"] * len(alive), max(timeout, 10.0))):
        if status == 200 and body:
            answers[r.rank].stack = body.decode(errors="replace")
    return answers


def _decode(body: bytes) -> dict | None:
    """An answer's JSON object (orjson where installed: about twice the stdlib's speed; the stdlib's reader for
    what orjson refuses, such as NaN), None when it is not one."""
    if _fastjson is not None:
        try:
            got = _fastjson.loads(body)
            return got if isinstance(got, dict) else None
        except ValueError:
            pass
    try:
        got = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return got if isinstance(got, dict) else None


def _fetch(ranks: list[Rank], paths: list[str], timeout: float) -> list:
    """One request to each rank's server, all at once (fanin.py): (status, body, error) each, in order."""
    requests = []
    for r, path in zip(ranks, paths):
        parts = urlsplit(r.url)
        where = path
        if parts.query:  # a server answering for several ranks names the rank in its registered URL's query
            where += ("&" if "?" in where else "?") + parts.query
        requests.append(fanin.Request(parts.hostname or "", parts.port or 80, where, timeout))
    return fanin.fetch(requests, CONCURRENCY, PER_SERVER, MAX_BODY)


# ---- the trace model -------------------------------------------------------------------------------------------

def traceset(job: Job, answers: dict[int, Answer]):
    """The answers as one TraceSet, read by trace's loaders as diagnose reads dump files, in memory: a rank's
    `trace_object` (already decoded with its answer) goes straight into the trace model, its `trace` text (a
    rank of an older distdoctor) and a Flight Recorder JSON through the readers of those files; every one is
    checked as a file is, and what does not load is a LoadError naming the rank's address."""
    from distdoctor.trace.loaders import assemble, gc_paused
    from distdoctor.trace.loaders.flight_recorder import load_fr_json_bytes
    from distdoctor.trace.loaders.fr_reader import Interner
    from distdoctor.trace.loaders.native import load_native, load_native_object
    from distdoctor.trace.model import LoadError, TraceSet

    interner = Interner()
    results = []
    with gc_paused():  # millions of small objects at 16 384 ranks: the collector would rescan them repeatedly
        for rank, a in sorted(answers.items()):
            path = f"live:{job.ranks[rank].url if rank in job.ranks else '?'}#rank{rank}"
            state = a.state if a.state is not None else {}
            try:
                if isinstance(state.get("trace_object"), dict):
                    trace = load_native_object(state["trace_object"], path)
                    trace.hang = state.get("hang") if isinstance(state.get("hang"), dict) else None
                    results.append(trace)
                elif isinstance(state.get("trace"), str):
                    results.append(load_native(state["trace"].encode(), path))
                elif a.fr is not None:
                    results.append(load_fr_json_bytes(a.fr, path, interner))
            except ValueError as exc:
                results.append(LoadError(path, str(exc)))
        return assemble(results, TraceSet(), job.world_size)


STACKS_AT_MOST = 256  # ranks asked for their stacks on a verdict poll


def single_out(answers: dict[int, Answer], limit: int = STACKS_AT_MOST) -> set[int]:
    """The ranks whose stacks a verdict needs, from the compact state of every rank (its per-group frontier: the
    last collective issued and completed): ranks are classed by that frontier;
    every rank of the smaller classes (the one that stopped short, the one that went ahead) and the first rank
    of every class, smallest classes first, at most `limit`. The other ranks stand where their class's first
    rank stands: their entries still come, their stacks would repeat it."""
    classes: dict[tuple, list[int]] = {}
    for rank, a in sorted(answers.items()):
        if a.state is None:
            continue  # its Python does not answer: py-spy's stack is asked for it (poll's pyspy)
        classes.setdefault(_frontier(a.state), []).append(rank)
    ordered = sorted(classes.values(), key=lambda rs: (len(rs), rs[0]))
    chosen = [rs[0] for rs in ordered]
    for ranks in ordered[:-1]:  # the largest class is the job's common frontier
        chosen.extend(ranks[1:])
    return set(chosen[:limit])


def _frontier(state: dict) -> tuple:
    """Per group the last collective issued and completed (issued beyond completed: a call in flight)."""
    progress = state.get("progress") if isinstance(state.get("progress"), dict) else {}
    return tuple(sorted((str(g), str(p.get("issued")), str(p.get("completed")))
                        for g, p in progress.items() if isinstance(p, dict)))
