"""Each rank serves its state through torch's own control plane: the worker server of torch.distributed.debug.

When the recorder comes alive in a rank (a process group exists), `start` registers the handler
`distdoctor_state` in torch's handler registry (`_register_handler`: every worker server of the process answers
it, the one the user's `start_debug_server` started included) and makes sure a worker server runs:

- the user's, when `torch.distributed.debug.start_debug_server` already started one (it listens where torch
  puts it: every interface);
- else our own `_WorkerServer`, bound to the one address of this host that routes to MASTER_ADDR — the
  interface the job's own traffic uses — and nowhere else.

Its address goes into the job's TCPStore (MASTER_ADDR:MASTER_PORT, the store torchrun and torch's debug server
use): `distdoctor_live/rank<R>` (JSON: url, host, pid, world size), the rank appended to `distdoctor_live/ranks`
(the registered ranks, "R," each: a watcher learns who registered in one read) and, when no debug server registered the rank,
torch's own `debug_server/rank<R>`, so torch's frontend finds us too. A watcher anywhere on the job's network
reads them (diagnose/live.py).

What the handler answers (JSON, bounded whatever the job ran before): this rank's progress per group (the last
collective issued and completed), the hang episode of its watchdog, Flight Recorder's `pg_status` when it
records, and a native trace holding only the active entries (calls in flight, at most MAX_ACTIVE) and the last
TAIL completed calls of each group — the frontiers; with `stacks=1`, the Python stack of every thread; with
`form=object`, that trace as one JSON object rather than native text. The handler compares its parameters with
fixed words only: no code or path sent to it is ever run or opened.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import socket
import sys
import threading
import time

from distdoctor.recorder.config import warn
from distdoctor.recorder.dumpfile import (all_thread_stacks, apply_standing, ensure_private_dir, fr_dumper, fr_enabled,
                                         fr_standing, write_atomic)
from distdoctor.trace import model

HANDLER, PREFIX, TORCH_PREFIX, LIVE_REASON = (model.LIVE_HANDLER, model.LIVE_PREFIX, model.TORCH_DEBUG_PREFIX,
                                               model.LIVE_REASON)
RUN_FILE = ".live.json"  # rank 0's store address, for `distdoctor run` on its host (recorder/run_live.py)
PEER_FILE = ".live-peer.json"  # the same from another rank: the verdict is made on rank 0's host
TAIL = 2  # completed calls kept per group: the frontier and the one before it
MAX_ACTIVE = 64  # calls in flight sent at most (the oldest: the ones a hang is about)
STORE_TIMEOUT_S = 10.0
SHUTDOWN_WAIT_S = 3.0
_THIS_DIR = os.path.dirname(os.path.abspath(__file__))

_rec = None  # the recorder whose state the handler serves
_published: dict = {}  # name -> callable giving JSON-ready data served with the state (publish)
_server = None  # our own _WorkerServer, when we started one
_started_for: int | None = None  # the pid that registered (a forked child must register again)
_starter: threading.Thread | None = None  # the thread that starts the server and registers it
_exiting = False  # the interpreter is ending: start no server any more


def start(rec) -> None:
    """Serve `rec`'s state (never raises; off with DISTDOCTOR_LIVE=0). The store is reached from a thread:
    a slow or absent store never delays the job."""
    global _started_for
    if os.environ.get("DISTDOCTOR_LIVE", "1") == "0" or _started_for == os.getpid():
        return
    _started_for = os.getpid()
    global _starter
    _starter = threading.Thread(target=_start, args=(rec,), name="distdoctor-live", daemon=True)
    atexit.register(stop)  # also when the process ends while the server is being started (a short job)
    _starter.start()


def _start(rec) -> None:
    try:
        from torch._C._distributed_c10d import _register_handler

        global _rec
        _rec = rec
        # torch's registry keeps the callable past the interpreter's end and frees it without the GIL, which
        # aborts the process when that frees the function object itself (a lambda or closure does): register a
        # module-level function and hold one reference forever, so that never happens.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_answer))
        _register_handler(HANDLER, _answer)
    except Exception as exc:  # an older torch without the control plane: the dump files still work
        warn(f"live state not served (torch has no worker-server handlers: {type(exc).__name__}: {exc})")
        return
    master = os.environ.get("MASTER_ADDR")
    port = os.environ.get("MASTER_PORT")
    if not master or not port:
        return  # no job store to register in (a process group made without MASTER_ADDR / MASTER_PORT)
    try:
        url = _server_url(master)
        _register(rec, master, int(port), url)
    except Exception as exc:
        warn(f"live state not registered in the job's store {master}:{port}: {type(exc).__name__}: {exc}")


def bind_address(master_addr: str) -> str:
    """This host's address on the route to the master: where the job's own traffic goes."""
    try:
        infos = socket.getaddrinfo(master_addr, 9, type=socket.SOCK_DGRAM)
        family, _, _, _, sockaddr = infos[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _server_url(master_addr: str) -> str:
    global _server
    addr = bind_address(master_addr)
    host = f"[{addr}]" if ":" in addr else addr
    user = _user_server()
    if user is not None:  # the user's start_debug_server: it listens on every interface, port known
        return f"http://{host}:{user.port}"
    from torch._C._distributed_c10d import _WorkerServer

    if _server is None:
        if _exiting:
            raise RuntimeError("the process is ending")
        _server = _WorkerServer(addr, 0)  # stop() ends its threads before the interpreter does (else it aborts)
    return f"http://{host}:{_server.port}"


def stop() -> None:
    """Shut our worker server down before the interpreter finalizes: a request served then would call our Python
    handler without an interpreter, and abort the process. shutdown() waits for the server's thread, which may
    be waiting for the GIL, so it runs on a thread of its own while this one waits with the GIL released."""
    global _server, _exiting
    _exiting = True
    starter = _starter
    if starter is not None and starter is not threading.current_thread():
        starter.join(SHUTDOWN_WAIT_S)  # a server half made while the interpreter ends aborts the process
    server, _server = _server, None
    if server is not None:
        t = threading.Thread(target=_shutdown, args=(server,), daemon=True)
        t.start()
        t.join(SHUTDOWN_WAIT_S)


def _shutdown(server) -> None:
    try:
        server.shutdown()
    except Exception:
        pass


def _user_server():
    debug = sys.modules.get("torch.distributed.debug")
    return getattr(debug, "_WORKER_SERVER", None) if debug is not None else None


def _register(rec, master: str, port: int, url: str) -> None:
    import datetime

    from torch.distributed import TCPStore

    store = TCPStore(master, port, is_master=False, timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
                     wait_for_workers=False)
    rank, world = rec.rank, rec.world_size
    entry = {"url": url, "host": socket.gethostname(), "pid": os.getpid(), "world_size": world}
    store.set(f"{PREFIX}rank{rank}", json.dumps(entry))
    store.set(f"{PREFIX}world_size", str(world))
    store.append(model.LIVE_REGISTERED, f"{rank},")  # who registered, in one key (diagnose/live.py's refresh)
    if not store.check([f"{TORCH_PREFIX}rank{rank}"]):
        store.set(f"{TORCH_PREFIX}rank{rank}", url)
    if os.environ.get("DISTDOCTOR_RUN") == "1":  # tell `distdoctor run` on this host where to look
        ensure_private_dir(rec.rank_dir())
        write_atomic(os.path.join(rec.rank_dir(), RUN_FILE if rank == 0 else PEER_FILE),
                     json.dumps({"master_addr": master, "master_port": port, "host": socket.gethostname()}).encode())


def publish(name: str, source) -> None:
    """Serve `source()` (JSON-ready, small) under `name` in this rank's state: how the health monitor's signals
    reach the watcher (health/monitor.py)."""
    _published[name] = source


# ---- the handler (runs on the worker server's thread, under the GIL) ---------------------------------------------

def _answer(req, resp) -> None:
    rec = _rec
    try:
        body = state(rec, stacks=_flag(req, "stacks"), full=_flag(req, "full"), as_object=_form(req) == "object")
        resp.set_content(body, "application/json")
        resp.set_status(200)
    except Exception as exc:  # a failing handler answers 500 with one line, never takes the rank down
        resp.set_content(f"{type(exc).__name__}: {exc}".encode(), "text/plain")
        resp.set_status(500)


def _form(req) -> str:
    try:
        return req.get_param("form")
    except Exception:
        return ""


def _flag(req, name: str) -> bool:
    try:
        return req.get_param(name) in ("1", "true")
    except Exception:
        return False


def state(rec, stacks: bool = False, full: bool = False, as_object: bool = False) -> bytes:
    """This rank's compact state (see the module's docstring); the trace only when `full` or `stacks`: as text in
    the native format (`trace`), or, `as_object` (`form=object`), as one object (`trace_object`,
    model.to_object)."""
    progress, keep = frontiers(list(rec.buffer))
    hang = rec.watchdog.hang_header() if rec.watchdog is not None else None
    trace = standing = None
    if full or stacks:
        threads = {t.ident: t.name for t in threading.enumerate()}
        rec._refresh_groups()
        trace = model.RankTrace(
            rank=rec.rank if rec.rank is not None else -1, source="native", version=str(model.NATIVE_VERSION),
            world_size=rec.world_size, groups=dict(rec.group_infos),
            entries=[rec._entry(r, threads) for r in keep], stacks=_stacks(rec) if stacks else None,
            dump_reason=LIVE_REASON, dump_time=time.time(), host=socket.gethostname(), pid=os.getpid(), hang=hang,
            exception=rec.exception)
        standing = fr_standing()
        apply_standing(trace, standing)  # NCCL: completed means the GPU completed it
    extras = {}
    for name, source in list(_published.items()):
        try:
            extras[name] = source()
        except Exception as exc:
            extras[name] = {"error": f"{type(exc).__name__}: {exc}"}
    pg_status = standing["pg_status"] if standing else _pg_status()  # read once: NCCL's dump is the same
    return payload(rec.rank, rec.world_size, hang, progress, rec.last_progress, trace, pg_status, extras,
                   as_object)


def frontiers(records: list) -> tuple[dict[str, dict], list]:
    """Per group the last collective issued and completed; the records worth sending: every call in flight (at
    most MAX_ACTIVE), the last TAIL completed calls of each group and the last completed send or recv of each
    peer and direction (a pair's messages complete in order, so its number says which of the peer's sends and
    receives are over: a send shown in flight, whose Work nobody waited on, pairs with it), in issue order."""
    progress: dict[str, dict] = {}
    kept_done: dict[str, int] = {}
    kept_pairs: set = set()
    keep = []
    active = 0
    for r in reversed(records):
        p = progress.setdefault(r.group, {"issued": None, "completed": None})
        if r.seq is not None:
            p["issued"] = max(p["issued"] or 0, r.seq)
            if r.state == "completed":
                p["completed"] = max(p["completed"] or 0, r.seq)
        pair = (r.group, r.op, r.peer) if r.p2p_seq is not None and r.peer is not None else None
        if r.state == "completed":
            if kept_done.get(r.group, 0) < TAIL or (pair is not None and pair not in kept_pairs):
                kept_done[r.group] = kept_done.get(r.group, 0) + 1
                keep.append(r)
            if pair is not None:
                kept_pairs.add(pair)
        elif active < MAX_ACTIVE:
            active += 1
            keep.append(r)
    keep.reverse()
    return progress, keep


def payload(rank, world_size, hang, progress, last_progress, trace=None, pg_status=None, extras=None,
            as_object: bool = False) -> bytes:
    """The answer's bytes: the trace under `trace` (native text) or, `as_object`, `trace_object` (one object whose
    fields a JSON decoder hands the reader directly; frames listed once). A group's member list travels only in its first member's trace (the loaders share one
    stated list among all members; the default group is the world): a 16 384-rank world's list, about 100 kB,
    is not repeated by every rank."""
    out = {"format": "distdoctor-live", "version": 1, "rank": rank, "host": socket.gethostname(), "pid": os.getpid(),
           "time": time.time(), "world_size": world_size, "last_progress": last_progress, "progress": progress,
           "hang": hang, "pg_status": pg_status, **(extras or {})}
    if trace is not None:
        out["host"], out["pid"] = trace.host, trace.pid
        trace.groups = {name: g if g.ranks and g.ranks[0] == rank and name != model.DEFAULT_GROUP
                        else model.GroupInfo(g.name, [], g.inferred, g.desc) for name, g in trace.groups.items()}
        if as_object:  # its hang episode is the answer's own (`hang`), not sent twice
            out["trace_object"] = {k: v for k, v in model.to_object(trace).items() if k != "hang"}
        else:
            out["trace"] = model.dumps(trace)
    return json.dumps(out).encode()


def _stacks(rec) -> dict:
    skip = rec.watchdog.ident if rec.watchdog is not None else None
    return all_thread_stacks(skip_ident=skip, trim_dir=_THIS_DIR + os.sep)


def _pg_status() -> dict | None:
    """Flight Recorder's per-group frontier (enqueued / started / completed), when it records."""
    if not fr_enabled():
        return None
    try:
        dump = fr_dumper("json")
        return None if dump is None else json.loads(dump(False, True)).get("pg_status")
    except Exception:
        return None
