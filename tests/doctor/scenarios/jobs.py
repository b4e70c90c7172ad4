"""Real 4-process Gloo jobs with planted faults that leave real Flight Recorder dumps behind.

    python tests/doctor/scenarios/jobs.py --out DIR [--scenario skip,sleep,...]

Each scenario is a tiny "training loop" of collectives; every rank records into Flight Recorder
(TORCH_FR_BUFFER_SIZE is set before torch is imported) and dumps both forms
(DIR/<scenario>/pickle/fr_trace_rank_<r>.pkl via _dump_fr_trace, DIR/<scenario>/json/fr_trace_rank_<r>.json via
_dump_fr_trace_json) the way a real job's watchdog would: when no collective has returned for STALL_S seconds
(the hang is on), when a collective raises (a peer died), or when the loop finished. A rank that exits leaves no
dump. With DISTDOCTOR_TRACE set, distdoctor's recorder is enabled too, so the same scenarios produce native dumps.

All scenarios run at once: torch is imported once here and the ranks are forked (cheap on 2 cores). The harness
kills every rank of a scenario once each has dumped or died, and everything at the deadline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import socket
import sys
import threading
import time

os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")  # must be set before the process group exists

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json  # noqa: E402  (before fork: imports are slow)
# Before the fork too: imported in each rank it took longer than STALL_S on a loaded host, and the rank's watchdog
# then dumped an empty trace before the pipeline had started.
from torch.distributed.pipelining import PipelineStage, Schedule1F1B  # noqa: E402

WORLD = 4
STALL_S = float(os.environ.get("SCENARIO_STALL_S", "3"))
PG_TIMEOUT_S = 60


class Watch:
    """The rank's own watchdog: dumps once, on a stall, an error or at the end."""

    def __init__(self, out: str, scenario: str, rank: int):
        self.out, self.scenario, self.rank = out, scenario, rank
        self.last = time.monotonic()
        self.lock = threading.Lock()
        self.dumped = False
        self.setting_up = False  # making process groups (new_group): not a stall
        threading.Thread(target=self._run, daemon=True).start()

    def tick(self) -> None:
        self.last = time.monotonic()

    def _run(self) -> None:
        while not self.dumped:
            time.sleep(0.1)
            if not self.setting_up and time.monotonic() - self.last > STALL_S:
                self.dump(f"no collective returned for {STALL_S:.0f} s")

    def dump_flight_recorder(self, pickled: bytes | None = None) -> None:
        base = os.path.join(self.out, self.scenario)
        for form, data in (("pickle", pickled or _dump_fr_trace(True, True, False)),
                           ("json", _dump_fr_trace_json(True, False))):
            os.makedirs(os.path.join(base, form), exist_ok=True)
            ext = "pkl" if form == "pickle" else "json"
            path = os.path.join(base, form, f"fr_trace_rank_{self.rank}.{ext}")
            with open(path + ".tmp", "wb") as f:
                f.write(data if isinstance(data, bytes) else data.encode())
            os.replace(path + ".tmp", path)

    def dump(self, reason: str, pickled: bytes | None = None) -> None:
        with self.lock:
            if self.dumped:
                return
            base = os.path.join(self.out, self.scenario)
            self.dump_flight_recorder(pickled)
            _native_dump(reason)
            with open(os.path.join(base, f"done_{self.rank}"), "w") as f:
                f.write(reason)
            self.dumped = True


def _native_enable(out: str, scenario: str) -> None:
    if not os.environ.get("DISTDOCTOR_TRACE"):
        return
    try:
        import distdoctor.recorder as recorder

        # dumps on demand only (Watch decides when), so both kinds of dump show the same moment
        recorder.enable(dump_dir=os.path.join(out, scenario, "native"), hang_timeout=0, dump_on_exit=False)
    except (ImportError, AttributeError):  # the recorder is not in this build
        pass


def _native_dump(reason: str) -> None:
    if not os.environ.get("DISTDOCTOR_TRACE"):
        return
    try:
        import distdoctor.recorder as recorder

        recorder.dump(reason)  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        pass
    except Exception as exc:  # the recorder's failure must not hide the Flight Recorder dump
        print(f"native dump failed: {exc}", file=sys.stderr)


# ---- the planted faults ----------------------------------------------------------------------------------------

def new_group(w: Watch, ranks: list[int]):
    """dist.new_group, not counted as a stall: making a group waits for every rank to arrive, which on a loaded
    host (every scenario's ranks start at once) took longer than STALL_S, and the watchdog then dumped traces
    with no collective in them."""
    w.setting_up = True
    try:
        return dist.new_group(ranks)
    finally:
        w.setting_up = False
        w.tick()


def ar(w: Watch, t: torch.Tensor, group=None) -> None:
    w.tick()
    dist.all_reduce(t, group=group)
    w.tick()


def gather_step(w: Watch, rank: int) -> None:
    """An all_gather so that the dumps themselves say the world has 4 ranks (its output is 4 x its input)."""
    w.tick()
    dist.all_gather_into_tensor(torch.empty(4 * WORLD), torch.full((4,), float(rank)))
    w.tick()


def s_ok(rank: int, w: Watch) -> None:
    for _ in range(3):
        ar(w, torch.ones(8))
        gather_step(w, rank)


def s_skip(rank: int, w: Watch) -> None:
    """Asymmetric code path: rank 2 skips the metrics all_reduce of step 1."""
    for step in range(3):
        ar(w, torch.ones(8))  # gradients
        if not (rank == 2 and step == 1):
            ar(w, torch.ones(8))  # metrics


def load_batch(rank: int, step: int) -> None:
    if rank == 1 and step == 2:
        time.sleep(3600)  # a data loader that never returns


def s_sleep(rank: int, w: Watch) -> None:
    for step in range(4):
        load_batch(rank, step)
        ar(w, torch.ones(8))


def s_exit(rank: int, w: Watch) -> None:
    for step in range(3):
        if rank == 3 and step == 1:
            os._exit(1)
        gather_step(w, rank)
        ar(w, torch.ones(8))


def s_dtype(rank: int, w: Watch) -> None:
    """Rank 2 reduces int32 where the others reduce float32 (same bytes, so Gloo does not notice)."""
    for step in range(3):
        dtype = torch.int32 if (rank == 2 and step == 1) else torch.float32
        ar(w, torch.ones(8, dtype=dtype))


def s_size(rank: int, w: Watch) -> None:
    """Rank 2 broadcasts into a buffer twice the size of everyone else's."""
    for step in range(3):
        ar(w, torch.ones(8))
        n = 16 if (rank == 2 and step == 1) else 8
        w.tick()
        dist.broadcast(torch.ones(n), src=0)


def s_order(rank: int, w: Watch) -> None:
    """Two groups over the same ranks; in step 1 ranks 2 and 3 use them in the other order."""
    a = new_group(w, list(range(WORLD)))
    b = new_group(w, list(range(WORLD)))
    for step in range(2):
        order = (b, a) if (step == 1 and rank >= 2) else (a, b)
        for g in order:
            ar(w, torch.ones(8), group=g)


def s_mesh(rank: int, w: Watch) -> None:
    """2x2 mesh [[0,1],[2,3]]: shard groups {0,1} '1', {2,3} '2'; replicate groups {0,2} '3', {1,3} '4'.
    In step 1, ranks 1 and 2 reduce over replicate before shard: 0 -> 1 -> 3 -> 2 -> 0 wait on each other."""
    groups = [new_group(w, r) for r in ([0, 1], [2, 3], [0, 2], [1, 3])]
    shard = groups[0] if rank in (0, 1) else groups[1]
    replicate = groups[2] if rank in (0, 2) else groups[3]
    for step in range(2):
        order = (replicate, shard) if (step == 1 and rank in (1, 2)) else (shard, replicate)
        for g in order:
            ar(w, torch.ones(8), group=g)


def s_p2p(rank: int, w: Watch) -> None:
    """Ranks 0 and 1 both receive first (Gloo's Flight Recorder does not record p2p)."""
    ar(w, torch.ones(8))
    if rank in (0, 1):
        peer = 1 - rank
        w.tick()
        dist.recv(torch.empty(8), src=peer)
        dist.send(torch.ones(8), dst=peer)
    ar(w, torch.ones(8))


def s_straggler(rank: int, w: Watch) -> None:
    """Rank 1 computes 0.25 s longer than the others before every collective: late, but no hang."""
    for _ in range(6):
        time.sleep(0.3 if rank == 1 else 0.05)
        ar(w, torch.ones(8))


# ---- the failures issue 11 saw called OK, and torch's own libraries ------------------------------------------

def stuck_loader() -> None:
    time.sleep(3600)  # a data loader that never returns


def s_async_left(rank: int, w: Watch) -> None:
    """Rank 3 starts its metrics all_reduce #4 without waiting for it and sticks in its data loader: ranks 0-2
    completed #4 and wait in the gradient all_reduce #5; rank 3's own dump still shows #4 in flight."""
    for step in range(3):
        ar(w, torch.ones(8))
        if rank == 3 and step == 1:
            dist.all_reduce(torch.ones(4), async_op=True)
            stuck_loader()
        ar(w, torch.ones(4))


def s_late(rank: int, w: Watch) -> None:
    """Gloo marks a collective completed from a background thread a moment after the call returned. Rank 3
    stops (a stuck data loader) right after an all_reduce returned, and dumps at once: as soon as a dump shows
    that all_reduce still in flight (one try in ten or so), though every rank completed it. Ranks 0-2 wait in
    the next all_reduce. The harness reports whether the dump caught it ("late": true)."""
    import pickle

    for i in range(400):
        ar(w, torch.ones(1000))
        if rank == 3:
            data = _dump_fr_trace(True, False, False)
            late = not pickle.loads(data)["entries"][-1].get("retired")
            if late or i == 399:
                w.dump(f"stopped after all_reduce #{i + 1}; late: {str(late).lower()}", pickled=data)
                stuck_loader()


def s_lone(rank: int, w: Watch) -> None:
    """A metrics group every rank made (new_group is collective) but only rank 2 reduces on, at step 1; the
    others go on into the next gradient all_reduce. From Gloo's dumps the group looks like rank 2's alone."""
    metrics = new_group(w, list(range(WORLD)))
    for step in range(3):
        ar(w, torch.ones(8))
        if rank == 2 and step == 1:
            ar(w, torch.ones(1), group=metrics)


def s_bcast_obj(rank: int, w: Watch) -> None:
    """broadcast_object_list with a root that differs per rank (rank 3's config says src=3)."""
    for step in range(3):
        ar(w, torch.ones(8))
        objs = [{"step": step, "rank": rank}]
        w.tick()
        dist.broadcast_object_list(objs, src=3 if (rank == 3 and step == 1) else 0)
        w.tick()


def forward(rank: int, step: int) -> None:
    if rank == 2 and step == 1:
        raise ValueError("shape [8] does not match [4] in layer 3")


def s_crash(rank: int, w: Watch) -> None:
    """Rank 2 raises in its forward at step 1; nothing catches it: the process dies the way an uncaught
    exception ends it (excepthook, exit 1). Its Flight Recorder dumps are written first, as a handler would."""
    for step in range(3):
        try:
            forward(rank, step)
        except ValueError:
            w.dump_flight_recorder()
            sys.excepthook(*sys.exc_info())
            os._exit(1)
        ar(w, torch.ones(8))


def s_ddp(rank: int, w: Watch) -> None:
    """DDP on a tiny model; rank 1 sticks in its data loader at step 2. The gradient all_reduces are issued from
    C++ (DDP's reducer): only Flight Recorder sees ranks 0, 2, 3 wait in one."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        w.tick()
        if rank == 1 and step == 2:
            stuck_loader()
        loss = model(torch.ones(4, 8)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ar(w, loss.detach().reshape(1))  # the logged loss, averaged in Python


def s_pipeline(rank: int, w: Watch) -> None:
    """Two 2-stage pipelines ({0,1} and {2,3}, torch.distributed.pipelining, 1F1B) of micro-batches of 2 rows;
    rank 1's config says 2 micro-batches where rank 0's says 4. Then every rank syncs at the end of the step."""
    pipes = [new_group(w, [0, 1]), new_group(w, [2, 3])]
    torch.manual_seed(0)
    stage_idx = rank % 2
    stage = PipelineStage(torch.nn.Linear(8, 8), stage_idx, 2, torch.device("cpu"), group=pipes[rank // 2])
    n_micro = 2 if rank == 1 else 4
    sched = Schedule1F1B(stage, n_micro, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    w.tick()
    if stage_idx == 0:
        sched.step(torch.ones(2 * n_micro, 8))
    else:
        sched.step(target=torch.zeros(2 * n_micro, 8))
    w.tick()
    ar(w, torch.ones(1))


SCENARIOS = {name[2:]: fn for name, fn in globals().items() if name.startswith("s_")}


def _settle(limit_s: float = 5.0) -> None:
    """Every collective of a finished loop has returned, but Gloo marks its Flight Recorder entry retired from
    a background thread a moment later: wait for that, so a finished rank never dumps a call as pending."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        entries = json.loads(_dump_fr_trace_json(True, False)).get("entries") or []
        if all(e.get("retired") for e in entries):
            return
        time.sleep(0.02)


def _rank_main(scenario: str, rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD))
    _native_enable(out, scenario)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    w = Watch(out, scenario, rank)
    try:
        SCENARIOS[scenario](rank, w)
        _settle()
        w.dump("finished")
    except Exception as exc:  # a peer died under us: dump what we have, like a real job's exception handler
        w.dump(f"{type(exc).__name__}: {str(exc)[:200]}")
    time.sleep(3600)  # stay alive so peers are not disturbed; the harness kills us


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(scenarios: list[str], out: str, deadline_s: float = 90.0) -> dict[str, dict]:
    status = _run_once(scenarios, out, deadline_s)
    # A scenario none of whose ranks dumped never started: on a loaded host another job's socket can take the
    # port chosen for its store between _free_port and the bind. Such a start is retried once on a new port.
    lost = [name for name, st in status.items() if not st["dump_reasons"] and not st["timed_out"]]
    if lost:
        retried = _run_once(lost, out, deadline_s)
        for name in lost:
            status[name] = dict(retried[name], first_attempt=status[name])
    return status


def _run_once(scenarios: list[str], out: str, deadline_s: float) -> dict[str, dict]:
    import multiprocessing as mp

    # The first stack-trace dump in a process symbolizes torch's own libraries (seconds); do it once here so
    # every forked rank inherits warm caches and dumps in milliseconds.
    from torch._C._profiler import gather_traceback, symbolize_tracebacks

    symbolize_tracebacks([gather_traceback(True, True, True)])
    ctx = mp.get_context("fork")
    procs: dict[str, list] = {}
    for name in scenarios:
        port = _free_port()
        procs[name] = [ctx.Process(target=_rank_main, args=(name, r, port, out), daemon=True) for r in range(WORLD)]
        for p in procs[name]:
            p.start()
    t0 = time.monotonic()
    status: dict[str, dict] = {}
    pending = set(scenarios)
    while pending and time.monotonic() - t0 < deadline_s:
        time.sleep(0.2)
        for name in list(pending):
            base = os.path.join(out, name)
            settled = [p.exitcode is not None or os.path.exists(os.path.join(base, f"done_{r}"))
                       for r, p in enumerate(procs[name])]
            if all(settled):
                pending.discard(name)
                status[name] = _finish(procs[name], base, t0)
    for name in pending:
        status[name] = _finish(procs[name], os.path.join(out, name), t0, timed_out=True)
    return status


def _finish(ps: list, base: str, t0: float, timed_out: bool = False) -> dict:
    exits = [p.exitcode for p in ps]
    for p in ps:
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGKILL)
    for p in ps:
        p.join(5)
    reasons = {}
    for r in range(WORLD):
        path = os.path.join(base, f"done_{r}")
        if os.path.exists(path):
            reasons[r] = open(path).read()
    return {"exitcodes": exits, "dump_reasons": reasons, "seconds": round(time.monotonic() - t0, 1),
            "timed_out": timed_out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--scenario", default=",".join(SCENARIOS), help="comma-separated; default: all")
    parser.add_argument("--deadline", type=float, default=90.0)
    args = parser.parse_args()
    names = [s for s in args.scenario.split(",") if s]
    unknown = [s for s in names if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}")
    os.makedirs(args.out, exist_ok=True)
    status = run(names, args.out, args.deadline)
    print(json.dumps(status, indent=1))


if __name__ == "__main__":
    main()
