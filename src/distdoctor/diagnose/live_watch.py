"""The live watcher: one verdict over every rank's evidence, polled through torch's control plane (diagnose/live.py).

Each poll (every `interval` seconds) asks every rank for its compact state. The job is
- suspected to hang when a rank's watchdog says so (recorder/hangwatch.py: a call in flight past the adaptive
  threshold), or when a rank has not answered for SILENT_S: its Python is silent while C++ still answers (the
  GIL is held), or nothing answers at all;
- confirmed when a rank's watchdog confirms it (no progress for the hang timeout).
On each new or graver episode the watcher polls once more for every rank's trace (its active entries and
frontiers) and for the stacks of the ranks the frontiers single out (Python's own for ranks that answer,
py-spy's for ranks whose Python does not), reads the answers into the trace model and prints diagnose's
analysis — the same findings and words — headed by the episode, plus one line per rank that did not answer
(what it did not answer, and what its peers say of it). Progress after an episode prints `resumed`.
"""

from __future__ import annotations

import re
import threading
import time

from distdoctor.diagnose import live
from distdoctor.findings.kinds import fmt_ranks
from distdoctor.trace.model import Frame

SILENT_S = 5.0  # a rank silent this long makes the job suspected
GONE_S = 10.0  # nothing answered this long: the job has ended
STILL_S = 1.0  # diagnose --live reads every rank twice this far apart: ranks that moved mean a running job
LEVEL = {"ok": 0, "suspected": 1, "confirmed": 2}


def report_of(job: live.Job, answers: dict[int, live.Answer], problem: str | None = None):
    """diagnose's report of the answers (the stacks py-spy read joined to their ranks)."""
    from distdoctor.diagnose.analyze import analyze
    from distdoctor.trace.loaders import gc_paused

    with gc_paused():  # as diagnose does: the collector would rescan 16 384 ranks' objects again and again
        ts = live.traceset(job, answers)
        for rank, a in answers.items():
            if a.stack and rank in ts.ranks and not ts.ranks[rank].stacks:
                ts.ranks[rank].stacks = pyspy_stacks(a.stack)
        return ts, analyze(ts)


_THREAD = re.compile(r'^Thread (\w+) \(([^)]*)\)(?:: "(.*)")?')
_FRAME = re.compile(r"^\s+(.+?) \((.+):(\d+)\)$")


def pyspy_stacks(text: str) -> dict[str, list[Frame]]:
    """py-spy dump's text as the trace model's stacks (thread -> frames, innermost last)."""
    stacks: dict[str, list[Frame]] = {}
    current = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            current = f"{m.group(3) or 'thread'} ({m.group(1)})"
            stacks[current] = []
            continue
        m = _FRAME.match(line)
        if m and current is not None:
            stacks[current].insert(0, Frame(m.group(1), m.group(2), int(m.group(3))))
    return {k: v for k, v in stacks.items() if v}


def silence_lines(job: live.Job, answers: dict[int, live.Answer], since: dict[int, float]) -> list[str]:
    """One line per rank that did not answer: what did not answer, for how long, and what its peers say."""
    lines = []
    now = time.time()
    for rank, a in sorted(answers.items()):
        r = job.ranks.get(rank)
        if a.state is not None or (a.python_silent and r is not None and not r.served):
            continue  # answered; a rank under torch's debug server only answers through torch's own handlers
        where = f"rank {rank} ({r.host or '?'}, pid {r.pid or '?'}, {r.url})" if r else f"rank {rank}"
        how_long = f" for {now - since[rank]:.0f} s" if rank in since else ""
        if a.python_silent:
            what = (f"its Python does not answer{how_long} ({a.error}) while torch's C++ server does: the GIL is "
                    "held, or the interpreter is stuck in C code; its Flight Recorder was read from C++")
        else:
            what = f"does not answer{how_long} ({a.error or a.fr_error})"
        stack = (" stack read by py-spy (below)" if a.stack else
                 " no stack: py-spy is not installed there" if a.python_silent else "")
        lines.append(f"{where}: {what};{stack}" if stack else f"{where}: {what}")
        waiting = _waiting_on(answers, rank)
        if waiting:
            lines.append(f"  its peers: {waiting}")
        if a.stack:
            for thread, frames in pyspy_stacks(a.stack).items():
                lines.append(f"  {thread}:")
                lines.extend(f"    {f.name} ({f.filename}:{f.line})" for f in reversed(frames))
    return lines


def _waiting_on(answers: dict[int, live.Answer], rank: int) -> str:
    """What the answering peers of `rank` are blocked in (from their hang episodes)."""
    blocked = {}
    for r, a in answers.items():
        hang = (a.state or {}).get("hang") or {}
        mine = hang.get("this_rank") or {}
        where = mine.get("blocked_in")
        if where and r != rank:
            key = f"{where['op']} #{where['seq']} on group {where['group']}"
            blocked.setdefault(key, []).append(r)
    if not blocked:
        return ""
    return "; ".join(f"{fmt_ranks(rs)} blocked in {what}" for what, rs in blocked.items())


class JobMoving(Exception):
    """Ranks completed collectives while every rank was read: no single picture of the job."""

    def __init__(self, ranks: list[int]) -> None:
        super().__init__(ranks)
        self.ranks = ranks


def snapshot(addr: str, port: int, world_size: int | None = None, timeout: float = 3.0):
    """One look at a running job (`diagnose --live`): (TraceSet, report, lines on the ranks that did not answer)."""
    store = live.connect(addr, port)
    job = live.discover(store, addr, port, world_size)
    before = live.poll(job, timeout=timeout)
    time.sleep(max(0.0, STILL_S - 0.0))  # a job that moves at all moves within this
    answers = live.poll(job, full=True, stacks=live.single_out(before), timeout=timeout, pyspy=True)
    moving = moved(before, answers)
    if moving:
        raise JobMoving(moving)
    ts, report = report_of(job, answers)
    lines = silence_lines(job, answers, {})
    missing = sorted(set(range(job.world_size)) - set(job.ranks))
    if missing:
        lines.append(f"{fmt_ranks(missing)}: never registered a server in the job's store")
    return ts, report, lines


def moved(before: dict[int, live.Answer], after: dict[int, live.Answer]) -> list[int]:
    """The ranks that issued or completed a call between two reads (both answered): their last progress or their
    completed frontier in some group differs."""
    out = []
    for rank, a in after.items():
        b = before.get(rank)
        if a.state is None or b is None or b.state is None:
            continue
        now, then = a.state.get("progress") or {}, b.state.get("progress") or {}
        if a.state.get("last_progress") != b.state.get("last_progress") or any(
                (now.get(g) or {}).get("completed") != (then.get(g) or {}).get("completed") for g in set(now) | set(then)):
            out.append(rank)
    return out


class LiveWatch:
    """Watch a job through its store at addr:port; `shout` prints verdicts, `say` what the watcher does."""

    def __init__(self, addr: str, port: int, say, shout, interval: float = 1.0, timeout: float = 1.5,
                 world_size: int | None = None, label: str = "distdoctor watch", metrics=None,
                 passive: bool = False) -> None:
        self.addr, self.port, self.say, self.shout = addr, port, say, shout
        self.interval, self.timeout, self.world_size, self.label = interval, timeout, world_size, label
        self.metrics = metrics  # a callable(self) after each poll (diagnose/live_metrics.py)
        self.passive = passive  # only poll (distdoctor run decides and prints: recorder/run_live.py)
        self.store = None
        self.job: live.Job | None = None
        self.state = "ok"
        self.episode_at = 0.0
        self.silent_since: dict[int, float] = {}
        self.answers: dict[int, live.Answer] = {}
        self.polls = 0
        self.verdicts = 0
        self.last_poll_s = 0.0
        self.evidence_s: dict = {}
        self.last_heard: float | None = None
        self.moving: list[int] = []  # ranks that progressed while the last verdict's evidence was read
        self.stop_event = threading.Event()

    # ---- connecting ------------------------------------------------------------------------------------------
    def attach(self, deadline: float) -> bool:
        """Reach the store and learn the ranks (retrying until `deadline`: the job may still be starting)."""
        from distdoctor.errors import InputError

        while not self.stop_event.is_set():
            try:
                if self.store is None:
                    self.store = live.connect(self.addr, self.port)
                self.job = live.discover(self.store, self.addr, self.port, self.world_size)
                return True
            except InputError as exc:
                if time.time() >= deadline:
                    self.say(f"cannot watch the job at {self.addr}:{self.port}: {exc}")
                    return False
                self.stop_event.wait(min(1.0, max(0.0, deadline - time.time())))
        return False

    # ---- watching --------------------------------------------------------------------------------------------
    def run(self, attach_s: float = 60.0, once: bool = False) -> int:
        """Poll until stopped (or, `once`, until the first verdict); returns the last hang level (0, 1, 2)."""
        if not self.attach(time.time() + attach_s):
            return 0
        if not self.passive:
            self.say(f"watching {self.job.world_size} ranks through the store at {self.addr}:{self.port}")
        while not self.stop_event.is_set():
            t0 = time.monotonic()
            try:
                self.step()
            except Exception as exc:  # watching must never take the job (or the run) down
                self.say(f"warning: a live poll failed ({type(exc).__name__}: {exc})")
            if once and self.verdicts:
                break
            if self.gone() and not self.passive:
                self.say(f"no rank has answered for {GONE_S:g} s: the job has ended (or its network is gone)")
                break
            self.stop_event.wait(max(0.0, self.interval - (time.monotonic() - t0)))
        return LEVEL[self.state]

    def gone(self) -> bool:
        """Nothing answered (not even torch's C++ server) in any poll for GONE_S, after ranks had answered."""
        if self.answers and any(a.state is not None or a.fr is not None for a in self.answers.values()):
            self.last_heard = time.time()
        return self.last_heard is not None and time.time() - self.last_heard >= GONE_S

    def step(self) -> None:
        if len(self.job.ranks) < self.job.world_size or any(r.url is None for r in self.job.ranks.values()):
            live.refresh(self.store, self.job)
        t0 = time.monotonic()
        answers = live.poll(self.job, timeout=self.timeout)
        self.last_poll_s = time.monotonic() - t0
        self.answers = answers
        self.polls += 1
        now = time.time()
        for rank in list(self.silent_since):
            if rank in answers and answers[rank].state is not None:
                del self.silent_since[rank]
        for rank, a in answers.items():
            if a.state is None and self.job.ranks[rank].served:
                self.silent_since.setdefault(rank, now)
        level, why = self._level(answers, now)
        if self.passive:
            self.state = level
        elif LEVEL[level] > LEVEL[self.state]:
            self._verdict(level, why)
        elif self.state != "ok" and level == "ok":
            self.shout(f"{self.label}: resumed after {now - self.episode_at:.1f} s: every rank answers and none "
                       "is blocked; still watching.")
            self.state = "ok"
        if self.metrics is not None:
            self.metrics(self)

    def _level(self, answers: dict[int, live.Answer], now: float) -> tuple[str, str]:
        worst, why = "ok", ""
        for rank, a in sorted(answers.items()):
            hang = (a.state or {}).get("hang") or {}
            status = hang.get("status")
            if status in ("suspected", "confirmed") and LEVEL[status] > LEVEL[worst]:
                mine = hang.get("this_rank") or {}
                where = mine.get("blocked_in")
                what = (f"{where['op']} #{where['seq']} on group {where['group']} in flight for "
                        f"{mine.get('blocked_for_s') or 0:.1f} s") if where else "no collective progress"
                worst, why = status, f"rank {rank}: {what}"
        silent = sorted(r for r, t in self.silent_since.items() if now - t >= SILENT_S)
        if silent and worst == "ok" and any(a.state is not None or a.fr is not None for a in answers.values()):
            # silence is suspicious beside ranks that answer; when nothing answers at all the job has ended
            worst, why = "suspected", f"{fmt_ranks(silent)} silent for {SILENT_S:g} s or more"
        return worst, why

    def evidence(self, allow_moving: bool = False):
        """Poll once more for every rank's trace, with the stacks of the ranks the last poll's frontiers single out
        (live.single_out; py-spy's for ranks whose Python is silent): (diagnose's report over every rank's
        state, one line each on the ranks that did not answer)."""
        before = dict(self.answers)
        silent = {r for r, a in before.items() if a.state is None}
        t0 = time.monotonic()
        answers = live.poll(self.job, full=True, stacks=live.single_out(before), timeout=self.timeout, pyspy=True)
        for rank in silent - {r for r, a in answers.items() if a.state is None}:
            answers[rank] = before[rank]  # it answered the second time only: keep what it said first
        t1 = time.monotonic()
        self.moving = moved(before, answers)
        if self.moving and not allow_moving:
            # Ranks read at different moments of a job that still runs are not one picture: the analysis would
            # take a rank read a step later for one that went ahead. No verdict from such a read.
            return None
        _, report = report_of(self.job, answers)
        self.evidence_s = {"poll_s": round(t1 - t0, 2), "analysis_s": round(time.monotonic() - t1, 2),
                           "bytes": sum(a.nbytes for a in answers.values())}
        lines = silence_lines(self.job, answers, self.silent_since)
        missing = sorted(set(range(self.job.world_size)) - set(self.job.ranks))
        if missing:
            lines.append(f"{fmt_ranks(missing)}: never registered a server in the job's store")
        if lines:
            lines.insert(0, "ranks that did not answer:")
        if self.moving:
            lines.append(f"note: {fmt_ranks(self.moving)} completed collectives while every rank was read (a part "
                         "of the job still runs): what is said of them is a moment of a moving job")
        return report, lines

    def _verdict(self, level: str, why: str) -> None:
        got = self.evidence()
        if got is None and level == "confirmed":  # no progress for the hang timeout where it is stuck: say it
            self.moving, got = [], self.evidence(allow_moving=True)
        if got is None:
            self.say(f"{why}, but {fmt_ranks(self.moving)} completed collectives while every rank was read: the "
                     "job is moving; no verdict yet")
            return
        self.state, self.episode_at = level, self.episode_at if self.state != "ok" else time.time()
        self.verdicts += 1
        report, lines = got
        from distdoctor.report.diagnose_text import render_text

        self.shout("")
        self.shout(f"{self.label}: HANG {level.upper()} at {time.strftime('%H:%M:%S')} ({why}); "
                   f"{sum(a.state is not None for a in self.answers.values())} of {self.job.world_size} ranks "
                   f"answered in {self.last_poll_s:.1f} s.")
        self.shout(render_text(report), nl=False)
        for line in lines:
            self.shout(line if line.endswith(":") else "  " + line)
        e = self.evidence_s
        self.say(f"verdict from every rank's state: poll {e['poll_s']:g} s ({e['bytes']} bytes), analysis "
                 f"{e['analysis_s']:g} s")
