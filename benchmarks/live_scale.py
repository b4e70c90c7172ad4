"""Live watcher at scale: many ranks' state served by a few processes through torch's worker servers, a real
TCPStore, the real watcher (`distdoctor watch --once`) in its own process.

Each server process runs one `_WorkerServer` and answers `distdoctor_state` for its share of the ranks (the rank
in the registered URL's query), with payloads built by the trace model's own serializer in the form
recorder/live.py sends: per rank the last two completed all_reduces and, after the stop, the one in flight
(with a `suspected` hang episode from SUSPECT_FLOOR_S on, as the rank's watchdog would raise it). At STOP_AFTER_S
one rank stops outside collectives; the clock starts once every rank is registered and the watcher has attached
(as a watcher that runs for the job's life has: its start-up is no part of the time to a verdict). Measured: the
watcher's suspected-verdict time after the stop (the floor included: when the verdict's first finding is printed;
and when the watcher has exited), its peak memory (ru_maxrss), bytes per rank per poll, and whether the verdict
names exactly that rank.

    python benchmarks/live_scale.py --ranks 1024 --servers 4
    python benchmarks/live_scale.py --ranks 1024 --servers 4 --watcher-tree /tmp/base   # another commit's watcher
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time

SUSPECT_FLOOR_S = 10.0
STOP_AFTER_S = 5.0
START_KEY = "live_scale/t0"  # the moment the job's steps start counting, set once the watcher is attached


def _wait_registered(store, world: int) -> None:
    from distdoctor.trace import model

    keys = [f"{model.LIVE_PREFIX}rank{r}" for r in range(world)]
    while not store.check(keys):
        time.sleep(0.5)


def _payload(rank: int, world: int, t0: float, stop_at: float, bad: int, now: float, full: str) -> bytes:
    """What recorder/live.py would answer for this rank (its own `payload`, the trace model's serializer)."""
    from distdoctor.recorder.live import payload
    from distdoctor.trace import model

    stopped = now >= stop_at
    seq = 100 + (0 if stopped else int((now - t0) * 10))
    done_to = seq - 1 if stopped else seq
    frames = [model.Frame("train_step", "/job/train.py", 41), model.Frame("<module>", "/job/train.py", 60)]
    entries = [model.Entry(index=s, group="0", op="all_reduce", seq=s, raw_op="all_reduce", in_sizes=[[1024]],
                           out_sizes=[[1024]], in_dtypes=["float32"], out_dtypes=["float32"], reduce_op="sum",
                           state="completed", t_created=now - 1, t_started=now - 1, t_completed=now - 1,
                           frames=frames) for s in (done_to - 1, done_to)]
    hang = None
    if stopped and rank != bad:
        entries.append(model.Entry(index=seq, group="0", op="all_reduce", seq=seq, raw_op="all_reduce",
                                   in_sizes=[[1024]], out_sizes=[[1024]], in_dtypes=["float32"],
                                   out_dtypes=["float32"], reduce_op="sum", state="started", t_created=stop_at,
                                   t_started=stop_at, frames=frames))
        if now - stop_at >= SUSPECT_FLOOR_S:
            hang = {"status": "suspected", "detected_by": rank, "detected_at": stop_at + SUSPECT_FLOOR_S,
                    "since": stop_at, "hang_timeout_s": 300, "threshold_s": SUSPECT_FLOOR_S,
                    "floor_s": SUSPECT_FLOOR_S, "factor": 3.0, "recent_wait_s": 0.01, "waits_seen": 100,
                    "this_rank": {"blocked_in": {"group": "0", "seq": seq, "op": "all_reduce",
                                                 "source": "recorder", "since": stop_at},
                                  "blocked_for_s": now - stop_at, "idle_for_s": now - stop_at}}
    stacks = {"MainThread (1)": frames if rank != bad else [model.Frame("<module>", "/job/train.py", 60),
                                                             model.Frame("load_batch", "/job/data.py", 12)]}
    if full.startswith("entries"):  # full=1: the trace without the stacks
        stacks = None
    trace = None
    if full:
        trace = model.RankTrace(rank=rank, source="native", version=str(model.NATIVE_VERSION), world_size=world,
                                groups={"0": model.GroupInfo("0", list(range(world)), False, "default_pg")},
                                entries=entries, stacks=stacks, dump_reason=model.LIVE_REASON, dump_time=now,
                                host=f"node{rank // 8}", pid=100000 + rank, hang=hang)
    progress = {"0": {"issued": entries[-1].seq, "completed": done_to}}  # as the recorder's frontiers() says
    return payload(rank, world, hang, progress, stop_at if stopped else now, trace,
                   as_object=full in ("entries", "stacks"))


def serve(args) -> None:
    """One server process: a worker server answering for ranks [lo, hi)."""
    import datetime

    from torch._C._distributed_c10d import _register_handler, _WorkerServer
    from torch.distributed import TCPStore

    from distdoctor.trace import model

    world, lo, hi, bad = args.ranks, args.lo, args.hi, args.bad
    started = time.time()
    clock: dict = {}  # t0, once the watcher is attached (the store's START_KEY)

    cache: dict = {}
    prepared: dict = {}  # the suspected phase's answers, built while the ranks wait out the floor

    def handler(req, resp):
        # In a job each rank builds its answer on its own CPU; here a few processes stand in for 16 384 ranks on
        # the watcher's two cores, so an answer is built once per rank and phase (healthy step, stopped,
        # suspected) and then served as is.
        rank = int(req.get_param("rank"))
        t0 = clock.get("t0", started)
        stop_at = t0 + args.stop_after if "t0" in clock else float("inf")
        full = ("stacks" if req.get_param("stacks") == "1" else "entries" if req.get_param("full") == "1" else "")
        if full and req.get_param("form") != "object":
            full += "-text"
        now = time.time()
        phase = (int((now - t0) * 10) if now < stop_at else -1 - (now - stop_at >= SUSPECT_FLOOR_S), full)
        got = prepared.get((rank, full)) if phase[0] == -2 else None
        got = got or cache.get((rank, full))
        if got is None or got[0] != phase:
            got = cache[(rank, full)] = (phase, _payload(rank, world, t0, stop_at, bad, now, full))
        body = got[1]
        resp.set_content(body, "application/json")
        resp.set_status(200)

    def prepare() -> None:
        """Build the answers of the suspected phase while the ranks wait out the suspect floor: a rank builds its
        answer when asked, on its own CPU, in about a millisecond; 16 384 of them built on demand by a few
        processes on the watcher's two cores would measure this rig, not the watcher."""
        t0 = clock["t0"] = float(TCPStore("127.0.0.1", args.port, is_master=False,
                                          timeout=datetime.timedelta(seconds=args.serve_s)).get(START_KEY))
        stop_at = t0 + args.stop_after
        time.sleep(max(0.0, stop_at - time.time()))
        then = stop_at + SUSPECT_FLOOR_S
        for rank in range(lo, hi):
            for full in args.asked.split(","):  # what the watcher asks of every rank
                prepared[(rank, full)] = ((-2, full), _payload(rank, world, t0, stop_at, bad, then, full))

    threading.Thread(target=prepare, daemon=True).start()
    _register_handler(model.LIVE_HANDLER, handler)
    server = _WorkerServer("127.0.0.1", 0)
    store = TCPStore("127.0.0.1", args.port, is_master=False, timeout=datetime.timedelta(seconds=60))
    keys = [f"{model.LIVE_PREFIX}rank{r}" for r in range(lo, hi)]
    values = [json.dumps({"url": f"http://127.0.0.1:{server.port}/?rank={r}", "host": f"node{r // 8}",
                          "pid": 100000 + r, "world_size": world}) for r in range(lo, hi)]
    store.multi_set(keys, values)
    store.set(f"{model.LIVE_PREFIX}world_size", str(world))
    if hasattr(model, "LIVE_REGISTERED"):  # as recorder/live.py's registration lists each rank
        store.append(model.LIVE_REGISTERED, "".join(f"{r}," for r in range(lo, hi)))
    print("serving", lo, hi, flush=True)
    time.sleep(args.serve_s)
    os._exit(0)  # the registered handler must not be freed at interpreter exit


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--stop-after", type=float, default=STOP_AFTER_S)
    ap.add_argument("--serve-s", type=float, default=120)
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--lo", type=int)
    ap.add_argument("--hi", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--bad", type=int)
    ap.add_argument("--asked", default=",entries")
    ap.add_argument("--watcher-tree", help="run the watcher of this source tree (a worktree of another commit, to "
                                           "compare side by side; its watcher asks every rank for the stacks)")
    args = ap.parse_args()
    if args.serve:
        return serve(args)
    import datetime

    from torch.distributed import TCPStore

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=60),
                     wait_for_workers=False)
    bad = args.ranks * 2 // 3
    per = -(-args.ranks // args.servers)
    procs = [subprocess.Popen([sys.executable, __file__, "--serve", "--ranks", str(args.ranks), "--lo", str(lo),
                               "--hi", str(min(args.ranks, lo + per)), "--port", str(port),
                               "--bad", str(bad), "--asked", ",stacks-text" if args.watcher_tree else ",entries",
                               "--stop-after", str(args.stop_after), "--serve-s", str(args.serve_s)],
                              stdout=subprocess.DEVNULL)
             for lo in range(0, args.ranks, per)]
    try:
        _wait_registered(store, args.ranks)
        watch = subprocess.Popen([sys.executable, "-m", "distdoctor", "watch", "--master-addr", "127.0.0.1",
                                  "--master-port", str(port), "--once", "--timeout", "10", "--interval", "1"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "PYTHONPATH": os.path.join(args.watcher_tree, "src")}
                                 if args.watcher_tree else None)
        err_lines: list[str] = []
        for line in watch.stderr:  # the watcher has attached: the job runs on, then one rank stops
            err_lines.append(line)
            if "watching" in line:
                break
        t0 = time.time() + 1
        stop_at = t0 + args.stop_after
        store.set(START_KEY, str(t0))
        printed: list[tuple[float, str]] = []  # (when, line): the verdict is printed line by line, flushed
        reader = threading.Thread(target=lambda: printed.extend((time.time(), ln) for ln in watch.stdout))
        reader.start()
        err = "".join(err_lines) + watch.stderr.read()
        watch.wait(timeout=args.serve_s)
        reader.join()
        t_done = time.time()
        out = "".join(ln for _, ln in printed)
        t_verdict = next((t for t, ln in printed if ln.startswith("1. ")), t_done)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # only the watcher has been waited for so far
        peak_kib = usage.ru_maxrss
        header = next((ln for ln in out.splitlines() if "HANG SUSPECTED" in ln), "")
        finding = next((ln for ln in out.splitlines() if ln.startswith("1. ")), "")
        late = stop_at + SUSPECT_FLOOR_S + 1
        brief = len(_payload(1, args.ranks, t0, stop_at, bad, late, ""))
        kinds = ("stacks-text", "stacks-text") if args.watcher_tree else ("entries", "stacks")
        full = len(_payload(1, args.ranks, t0, stop_at, bad, late, kinds[0]))
        stacked = len(_payload(bad, args.ranks, t0, stop_at, bad, late, kinds[1]))
        print(json.dumps({"ranks": args.ranks, "servers": args.servers, "cores": os.cpu_count(),
                          "verdict_after_stop_s": round(t_verdict - stop_at, 2),
                          "watcher_exited_after_stop_s": round(t_done - stop_at, 2), "suspect_floor_s": SUSPECT_FLOOR_S,
                          "watcher_peak_mib": round(peak_kib / 1024, 1),
                          "watcher_cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
                          "bytes_per_rank_per_poll": brief,
                          "bytes_per_rank_verdict_poll": full, "bytes_singled_out_rank_verdict_poll": stacked,
                          "verdict_poll": next((ln for ln in err.splitlines() if "verdict from" in ln), ""),
                          "named": finding, "header": header, "rc": watch.returncode,
                          "stderr": err[-600:]}, indent=1))
    finally:
        for p in procs:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
