"""Is this rank hung? The adaptive hang rule, the hang episode a rank is in, and a look into Flight Recorder.

In flight: a collective or p2p call this rank issued that has not completed, seen by the recorder (calls made
from Python) or in Flight Recorder (what C++ issues, such as DDP's gradient buckets: an entry not yet retired).
`since` is when the oldest one was issued.

Suspected: a call in flight for longer than threshold = max(floor, factor x L), L being the longest wait among
the last WAITS_KEPT completed collectives of this rank: the job's own recent collective latency. A job whose
ranks routinely wait 30 s in a barrier for a checkpointing rank 0 raises its own threshold after the first such
wait, so only the first pause is reported (suspected, then resumed). Confirmed: still no progress after the
hang timeout (blocked that long, or — the rule for the rank that never reaches the next collective — nothing
issued or completed for that long). Resumed: this rank made progress (issued or completed a collective, here
or in Flight Recorder) after the episode opened. A rank that is asked to dump for an episode another rank
detected (`adopt`) joins that episode; every dump's header carries it (`header()`).

Start-up is not a hang (`_stalled`): until every rank of the job has issued its first collective (each says so
in the job's store; one may still be importing torch or building its model, slowly on a loaded host), a wait and
a rank that issued nothing are never suspected, and confirmed only after the start timeout, max(start_timeout,
hang_timeout); the episode says `start_up: true` and the reason says "during start-up".

Flight Recorder is read (about 30 ms for 2000 entries on this machine, so not every tick) only when the
recorder saw no Python-level call for QUIET_S and nothing is pending at the Python level, and then: every tick
while an episode is open; every STILL_PEEK_S while the main thread sits at the same place (inside one C call:
a backward blocked on a gradient bucket, or a sleep); and every PROGRESS_PEEK_S otherwise, so a job whose
collectives are all issued from C++ shows progress and is never taken for idle. A look says only that something
moved since the last one, not when: so Flight Recorder is looked at afresh before a hang is called and when a
rank joins an episode, and only a move seen after that counts as a resume (a look seconds old, taken before the
stall, would otherwise read the calls issued before it as progress after it: a false resume).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from distdoctor.recorder.dumpfile import fr_dumper, fr_enabled

QUIET_S = 2.0
STILL_PEEK_S = 2.0
PROGRESS_PEEK_S = 30.0
ORDER = {"resumed": 0, "suspected": 1, "confirmed": 2}
STARTED_KEY = "distdoctor/started/{}"  # set in the job's store by each rank once it issued a collective
STORE_TIMEOUT_S = 5.0
_STORE = None  # _job_store's client


class FlightRecorderPeek:
    """The oldest entry Flight Recorder has not retired, and whether anything moved since the last look."""

    def __init__(self) -> None:
        self.available = fr_enabled()
        self._decoder = None
        self.key = None
        self.seen_any = False  # an entry was seen: this rank has issued a collective (hangwatch's start-up)
        self.done_groups: set[str] = set()  # groups with a collective retired here: all their members issued one
        self.inflight: dict[int, float] = {}  # record id -> created, seen unretired (for wait samples)

    def _setup(self) -> bool:
        try:
            import msgspec
        except Exception:
            self.available = False
            return False
        # only the fields read here: msgspec skips the others without building them
        entry = msgspec.defstruct("FrEntry", [
            ("record_id", int, -1), ("retired", bool, True), ("time_created_ns", int, 0),
            ("collective_seq_id", int, 0), ("p2p_seq_id", int, 0), ("is_p2p", bool, False),
            ("profiling_name", str, ""), ("process_group", list, []), ("state", str, "")])
        dump = msgspec.defstruct("FrDump", [("entries", list[entry], []), ("pg_status", dict, {})])
        self._decoder = msgspec.json.Decoder(dump)
        return True

    def look(self, now: float) -> tuple[dict | None, bool, list[float]]:
        """(oldest entry in flight or None, progress since the last look, waits of entries seen retiring)."""
        if not self.available or (self._decoder is None and not self._setup()):
            return None, False, []
        try:
            dump = fr_dumper("json")  # asked each time: NCCL's recorder once the job has an NCCL group
            got = self._decoder.decode(dump(True, True))
        except Exception:
            self.available = False
            return None, False, []
        entries = got.entries
        self.seen_any = self.seen_any or bool(entries)
        self.done_groups.update(str(e.process_group[0]) for e in entries
                                if e.retired and not e.is_p2p and e.process_group)
        open_ = [e for e in entries if not e.retired]
        key = (entries[-1].record_id if entries else None, tuple(e.record_id for e in open_), _progress(got.pg_status))
        moved = self.key is not None and key != self.key
        self.key = key
        still = {e.record_id for e in open_}
        waits = [now - t for rid, t in self.inflight.items() if rid not in still]
        self.inflight = {e.record_id: e.time_created_ns / 1e9 for e in open_}
        if not open_:
            return None, moved, waits
        e = min(open_, key=lambda x: x.time_created_ns)
        group = str(e.process_group[0]) if e.process_group else "?"
        flight = {"since": e.time_created_ns / 1e9, "group": group, "op": e.profiling_name.split(":")[-1],
                  "seq": e.p2p_seq_id if e.is_p2p else e.collective_seq_id, "source": "flight_recorder"}
        if e.profiling_name.startswith(("nccl:", "xccl:")):
            # NCCL: the call returned when the CPU enqueued it; the entry's state and the groups' frontiers say
            # where the GPU is (scheduled: its stream has not started it, or timing is off)
            flight["gpu"] = {"state": e.state, "ran_ahead": _ran_ahead(got.pg_status)}
        return flight, moved, waits


def _progress(pg_status: dict) -> tuple:
    """What moves when a GPU completes work: each group's completed (and started) frontier."""
    return tuple(sorted((str(k), str(v.get("last_started_collective")), str(v.get("last_completed_collective")))
                        for k, v in pg_status.items() if isinstance(v, dict)))


def _ran_ahead(pg_status: dict) -> dict[str, list]:
    """pg_id -> [enqueued, started, completed] for the groups whose CPU enqueued work its GPU has not completed."""
    out = {}
    for pg_id, v in pg_status.items():
        try:
            enq, started, done = (int(v.get(k, -1)) for k in (
                "last_enqueued_collective", "last_started_collective", "last_completed_collective"))
        except (AttributeError, TypeError, ValueError):
            continue
        if enq > done:
            out[str(pg_id)] = [enq, started if started >= 0 else None, done]
    return out


class HangWatch:
    def __init__(self, rec) -> None:
        self.rec = rec
        self.episode: dict | None = None
        self.fr = FlightRecorderPeek()
        self.fr_flight: dict | None = None
        self.fr_flight_at = 0.0
        self.fr_progress_at = 0.0
        self.last_peek = 0.0
        self._main_pos = None
        self._main_still_since = time.time()
        self._opened_at = 0.0
        self._episodes = 0
        self._lock = threading.Lock()
        self.store = _job_store  # the job's store: where ranks say they issued their first collective
        self._marked: set[int] = set()  # ranks this one has said in the store have started
        self._all_started = False

    # ---- what this rank is doing ---------------------------------------------------------------------------
    def threshold(self) -> dict | None:
        cfg = self.rec.config
        if not cfg.suspect_floor:
            return None
        waits = list(self.rec.waits)
        longest = max(waits) if waits else 0.0
        return {"threshold_s": round(max(cfg.suspect_floor, cfg.suspect_factor * longest), 3),
                "floor_s": cfg.suspect_floor, "factor": cfg.suspect_factor, "recent_wait_s": round(longest, 3),
                "waits_seen": len(waits)}

    def in_flight(self) -> dict | None:
        """The oldest call in flight: the recorder's own pending calls, else Flight Recorder's last look (valid
        while the recorder saw nothing newer)."""
        pending = list(self.rec.pending)
        if pending:
            r = min(pending, key=lambda x: x.t_created)
            return {"since": r.t_created, "group": r.group, "op": r.op,
                    "seq": r.seq if r.seq is not None else r.p2p_seq, "source": "recorder"}
        if self.fr_flight is not None and self.fr_flight_at >= self.rec.last_progress:
            return self.fr_flight
        return None

    def progress_at(self) -> float:
        return max(self.rec.last_progress, self.fr_progress_at)

    def _main_is_still(self, now: float) -> bool:
        frame = sys._current_frames().get(threading.main_thread().ident)
        pos = (id(frame), frame.f_lasti) if frame is not None else None
        if pos != self._main_pos:
            self._main_pos, self._main_still_since = pos, now
        return now - self._main_still_since >= 1.0

    def _peek(self, now: float) -> None:
        rec = self.rec
        if not self.fr.available or rec.pending or now - rec.last_progress < QUIET_S:
            return
        age = now - self.last_peek
        open_episode = self.episode is not None and self.episode["status"] != "resumed"
        if not (open_episode and age >= 0.9 or self._main_is_still(now) and age >= STILL_PEEK_S
                or age >= PROGRESS_PEEK_S):
            return
        self._rebase(now)

    def _rebase(self, now: float) -> None:
        """Look at Flight Recorder now. Before a hang is called and when an episode is joined: what moved since
        the last look (seconds ago, maybe before the stall) is then taken for what it is, progress before this
        moment, and never for a resume after it."""
        if not self.fr.available:
            return
        self.last_peek = now
        flight, moved, waits = self.fr.look(now)
        self.fr_flight, self.fr_flight_at = flight, now
        if moved:
            self.fr_progress_at = now
        self.rec.waits.extend(waits)

    # ---- the rule ------------------------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> tuple[str, str] | None:
        """One look; returns ("dump", reason), ("rewrite", reason) (record a resume in the last dump) or None."""
        now = time.time() if now is None else now
        timeout = self.rec.config.hang_timeout
        if not timeout:
            return None
        self._peek(now)
        with self._lock:
            ep = self.episode
            if ep is not None and ep["status"] != "resumed":
                return self._follow(ep, now, timeout)
            self._mark_started(now)
            found = self._stalled(ep, now, timeout)
            if self.fr.available and self.last_peek < now and (
                    found is not None or self._starting() and now - self.progress_at() >= timeout
                    and now - self.last_peek >= STILL_PEEK_S):
                # a hang is called on a fresh look, never on a stale one (nor start-up on a look before the C++
                # side issued its first collective)
                self._rebase(now)
                found = self._stalled(ep, now, timeout)
            if found is None:
                return None
            status, since, flight, th, stalled_for, start_up = found
            self._open(status, since, flight, th, now, start_up)
            return "dump", self._reason(status, stalled_for, flight, th, start_up)

    def _stalled(self, ep: dict | None, now: float, timeout: float) -> tuple | None:
        """(status, since, the call in flight or None, threshold, for how long, during start-up) when this rank is
        now suspected or confirmed to hang; None otherwise.

        Start-up is not a hang: until every rank of the job has issued its first collective (`_job_started`),
        a rank may still be importing torch or building its model, slowly on a loaded host. A wait then, and a
        rank that has issued nothing yet, have no suspected stage (a slow start is no alarm) and are confirmed
        after the start timeout, max(start_timeout, hang_timeout); every other wait as before. Once every rank
        has issued a collective, a wait in a group's very first call (a rank that skipped it, two ranks that both
        receive first) is a hang like any other."""
        flight = self.in_flight()
        th = self.threshold()
        start = self._start_bound(timeout)
        if flight is not None:
            blocked = now - flight["since"]
            if blocked >= (min(th["threshold_s"], timeout) if th else timeout):
                start_up = start > timeout and not self._job_started()
                if not start_up:
                    return ("confirmed" if blocked >= timeout else "suspected"), flight["since"], flight, th, \
                        blocked, False
                if blocked >= start:
                    return "confirmed", flight["since"], flight, th, blocked, True
                return None  # waiting for a member still starting, within the start timeout: not idle either
        quiet_since = self.progress_at()
        if not self.fr.available:
            # Without Flight Recorder the collectives C++ issues (DDP's buckets) are invisible: a rank whose
            # main thread keeps moving is then not taken for idle.
            self._main_is_still(now)
            quiet_since = max(quiet_since, self._main_still_since)
        idle = now - quiet_since
        if idle < timeout or ep is not None and ep.get("since") == round(quiet_since, 3):
            return None
        start_up = start > timeout and (self._starting() or not self._job_started())
        if idle >= (start if start_up else timeout):
            return "confirmed", quiet_since, None, th, idle, start_up
        return None

    def _start_bound(self, timeout: float) -> float:
        start = getattr(self.rec.config, "start_timeout", 0.0) or 0.0
        return max(start, timeout)

    def _starting(self) -> bool:
        """No collective issued here yet: none the recorder saw, none in Flight Recorder's last look."""
        return not (self.rec.seq or self.rec.p2p_seq or self.fr.seen_any)

    def _mark_started(self, now: float) -> None:
        """Say in the job's store which ranks have started: this one once it issued its first collective, and every
        member of a group this rank completed a collective on (all of them issued it), so that a rank stopped
        before its own watchdog could say so is still known to have started. Until this rank has issued one,
        Flight Recorder is looked at every STILL_PEEK_S (a job whose collectives are all issued from C++ would
        otherwise be seen starting for up to PROGRESS_PEEK_S, and its peers' waits held to the start timeout that
        long); it holds few entries then, so a look is cheap."""
        if self._starting() and self.fr.available and now - self.last_peek >= STILL_PEEK_S:
            self._rebase(now)
        proven = self._proven_ranks()
        if not self._starting() and self.rec.rank is not None:
            proven.add(self.rec.rank)
        new = proven - self._marked
        if not new:
            return
        self._marked |= new
        try:
            store = self.store()
            if store is not None:
                for r in sorted(new):
                    store.set(STARTED_KEY.format(r), "1")
        except Exception:
            pass

    def _job_started(self) -> bool:
        """Every rank of the job has issued its first collective (each says so in the job's store once it has;
        asked only when a wait is long enough to matter, and never again once true). Where the store cannot be
        asked, the job counts as started: every wait is held to the hang timeout, as without a start timeout."""
        if not self._all_started and self._proven_started():
            self._all_started = True
        if not self._all_started:
            try:
                store = self.store()
                world = self.rec.world_size
                self._all_started = store is None or not world or bool(
                    store.check([STARTED_KEY.format(r) for r in range(world)]))
            except Exception:
                self._all_started = True
        return self._all_started

    def _proven_ranks(self) -> set[int]:
        """The members of every group this rank completed a collective on (the recorder's and Flight Recorder's,
        which sees those issued from C++): each of them issued it, so each has started."""
        done = {r.group for r in list(getattr(self.rec, "buffer", ())) if r.state == "completed" and r.seq is not None}
        done |= getattr(self.fr, "done_groups", set())
        members: set[int] = set()
        for name, ranks, *_ in list(getattr(self.rec, "groups", {}).values()):
            if name in done:
                members.update(ranks)
        return members

    def _proven_started(self) -> bool:
        """This rank's own completions cover the world: the job has started, whatever the store says."""
        world = getattr(self.rec, "world_size", None)
        return bool(world) and len(self._proven_ranks()) >= world

    def _follow(self, ep: dict, now: float, timeout: float) -> tuple[str, str] | None:
        if self.progress_at() > self._opened_at:
            before = ep["status"]
            ep["status"], ep["resumed_at"] = "resumed", self.progress_at()
            ep["resumed_after_s"] = round(self.progress_at() - ep["since"], 3)
            return "rewrite", (f"hang resumed: progress after {ep['resumed_after_s']:.1f} s "
                               f"(hang {before} at {_clock(ep['detected_at'])})")
        start_up = bool(ep.get("start_up"))
        if ep["status"] == "suspected" and now - ep["since"] >= (self._start_bound(timeout) if start_up else timeout):
            ep["status"], ep["confirmed_at"] = "confirmed", now
            return "dump", self._reason("confirmed", now - ep["since"], self.in_flight(), self.threshold(), start_up)
        return None

    def _open(self, status: str, since: float, flight: dict | None, th: dict | None, now: float,
              start_up: bool = False) -> None:
        self._episodes += 1
        rank = self.rec.rank
        self.episode = {"status": status, "id": f"{socket.gethostname()}:{os.getpid()}:{self._episodes}",
                        "detected_by": rank, "detected_at": round(now, 3), "since": round(since, 3),
                        "hang_timeout_s": self.rec.config.hang_timeout, **(th or {}),
                        "blocked_in": _public(flight), "requested": False}
        if start_up:
            self.episode.update(start_up=True, start_timeout_s=self._start_bound(self.rec.config.hang_timeout))
        self._opened_at = now

    def _reason(self, status: str, blocked: float, flight: dict | None, th: dict | None,
                start_up: bool = False) -> str:
        what = (f"{flight['op']} #{flight['seq']} on group {flight['group']}"
                + (" (Flight Recorder)" if flight["source"] == "flight_recorder" else "")
                + _gpu_words(flight.get("gpu"))) if flight else None
        if start_up:
            return self._start_reason(blocked, what)
        if status == "suspected":
            return (f"hang suspected: {what} in flight for {blocked:.1f} s (threshold {th['threshold_s']:g} s = "
                    f"max(floor {th['floor_s']:g} s, {th['factor']:g} x longest recent wait "
                    f"{th['recent_wait_s']:.2f} s))")
        pending = self.rec.pending_summary() if self.rec.pending else (
            f"in flight: {what}" if what else "no collective pending")
        return (f"hang: no collective completed for {blocked:.1f} s (hang timeout "
                f"{self.rec.config.hang_timeout:g} s; {pending})")

    def _start_reason(self, blocked: float, what: str | None) -> str:
        bound = f"start timeout {self._start_bound(self.rec.config.hang_timeout):g} s"
        if what is None and self._starting():
            return (f"hang: during start-up: no collective issued for {blocked:.1f} s since the process group was "
                    f"created ({bound})")
        what = f"{what} in flight" if what else "no collective completed"
        return (f"hang: during start-up: {what} for {blocked:.1f} s, and a rank of the job has issued no collective "
                f"yet ({bound})")

    def adopt(self, hang: dict) -> bool:
        """Another rank detected a hang and `distdoctor run` asks this rank to dump for it. Returns False when
        this rank already dumped for an episode at least as grave (no second dump)."""
        with self._lock:
            ep = self.episode
            status = hang.get("status") if hang.get("status") in ORDER else "suspected"
            if ep is not None and ep["status"] != "resumed" and ORDER[ep["status"]] >= ORDER[status]:
                return False
            self.episode = {**hang, "status": status, "requested": True}
            if ep is None or ep["status"] == "resumed":
                self._opened_at = time.time()
                self._rebase(self._opened_at)
            return True

    def header(self) -> dict | None:
        """The dump header's `hang`: the episode and this rank's own state at the moment of the dump."""
        ep = self.episode
        if ep is None:
            return None
        now = time.time()
        flight = self.in_flight()
        mine = {"blocked_in": _public(flight), "blocked_for_s": round(now - flight["since"], 3) if flight else None,
                "idle_for_s": round(now - self.progress_at(), 3)}
        return {**ep, "this_rank": mine}


def _job_store():
    """A client of the job's store of its own (MASTER_ADDR:MASTER_PORT, as torch's env:// rendezvous reaches it),
    made once; None without one. Not the default group's client: under NCCL a rank's main thread can sit in
    that client's blocking get (the communicator's id exchange at the first collective) holding its lock for the
    store's whole timeout, and the watchdog must never wait behind it. Each call on this one is bounded."""
    global _STORE
    if _STORE is None:
        master, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not master or not port:
            return None
        import datetime

        from torch.distributed import TCPStore

        _STORE = TCPStore(master, int(port), is_master=False, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
    return _STORE


def _public(flight: dict | None) -> dict | None:
    return None if flight is None else {k: flight[k] for k in ("group", "seq", "op", "source", "gpu") if k in flight} | {
        "since": round(flight["since"], 3)}


def _gpu_words(gpu: dict | None) -> str:
    """Under NCCL: the call returned long ago; where the GPU stands (diagnose's gpu_stopped reads the same)."""
    if not gpu:
        return ""
    ahead = gpu.get("ran_ahead") or {}
    groups = "; ".join(f"group {g}: enqueued up to #{e}, completed up to #{d}" for g, (e, _s, d) in
                       sorted(ahead.items())[:3])
    where = ("its GPU stream has not started it, or collective timing is off" if gpu.get("state") == "scheduled" else
             "its GPU started it and waits for the other members" if gpu.get("state") == "started" else
             f"state {gpu.get('state')}")
    return (f" - enqueued by the CPU, not completed by the GPU ({where}"
            + (f"; {groups}" if groups else "") + "): gpu_stopped unless a peer's GPU holds it")


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
