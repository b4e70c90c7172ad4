"""What `distdoctor run` does while the job runs, and what it says when it ends.

While the job runs (`JobWatch.poll`, every POLL_S): it reads the header line of each rank's dump when the file
changed. When a rank's watchdog dumped for a suspected or confirmed hang (recorder/hangwatch.py), it writes the
episode to `.request.json` in the dump directory and sends SIGUSR1 to every registered rank on this host that
has not dumped for it yet — the rank stuck outside any collective, whose stack is the answer, included; ranks
blocked inside a collective dump from their watchdog thread. Once every registered, live rank dumped (or after
FANOUT_WAIT_S) it analyzes the dumps and prints the verdict on stdout, marked SUSPECTED or CONFIRMED. The job
keeps running: when a rank reports progress (its dump rewritten as `resumed`) it prints `resumed after X s`
and keeps watching. Only with --kill-on-hang, a confirmed hang stops the job (SIGTERM to the command, which
torchrun passes to its workers, each dumping once more; SIGKILL after --kill-grace, KILL_GRACE_S by default).

At the end (`closing_report`): the verdict on the dumps (on stdout), and never `verdict: OK` when the command
failed or a rank died of an exception: the closing line names the crashed ranks, their exception and the
command's exit code. Then it removes what ranks left behind in the dump directory (pid files of ranks that
were killed, the request file, temporary files of writers that died) and the directory itself when it is empty
and `run` created it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

from distdoctor.recorder import layout
from distdoctor.recorder.dumpfile import write_atomic
from distdoctor.recorder.run_live import RunLive
from distdoctor.recorder.watchdog import REQUEST_FILE

POLL_S = 0.25
FANOUT_WAIT_S = 6.0
KILL_GRACE_S = 30.0
ORPHAN_GRACE_S = 10.0
RESUME_RACE_S = 1.0  # a hang a rank reports this soon after another rank's resume is taken for the same stall
ORDER = {"resumed": 0, "suspected": 1, "confirmed": 2}


def registered_ranks(dump_dir: str) -> dict[int, tuple[int, str]]:
    """rank -> (pid, host) of every rank that registered in dump_dir (`.rank_<r>.pid`, either layout)."""
    return registered_ranks_in(layout.find(dump_dir, ".rank_*.pid"))


def registered_ranks_in(paths: list[str]) -> dict[int, tuple[int, str]]:
    found = {}
    for path in paths:
        try:
            rank = int(os.path.basename(path)[len(".rank_"):-len(".pid")])
            with open(path) as f:
                lines = f.read().split()
            found[rank] = (int(lines[0]), lines[1] if len(lines) > 1 else socket.gethostname())
        except (OSError, ValueError, IndexError):
            continue
    return found


def alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan nobody reaped yet has ended all the same)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _state(pid) not in ("Z", "X")


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, or traced): a signal other than SIGKILL or SIGCONT waits until it runs."""
    return _state(pid) in ("T", "t")


def _state(pid: int) -> str | None:
    """The process's state letter in /proc (R, S, T, Z...), None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def signal_ranks(dump_dir: str, signum: int = signal.SIGUSR1, ranks=None) -> list[int]:
    """Send `signum` to every live rank of this host registered in dump_dir (or those of `ranks`)."""
    host = socket.gethostname()
    sent = []
    for rank, (pid, where) in sorted(registered_ranks(dump_dir).items()):
        if where != host or (ranks is not None and rank not in ranks):
            continue
        try:
            os.kill(pid, signum)
            sent.append(pid)
        except OSError:
            continue
    return sent


def read_header(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline())
        return header if isinstance(header, dict) and isinstance(header.get("rank"), int) else None
    except (OSError, ValueError):
        return None


class JobWatch:
    def __init__(self, dump_dir: str, child: subprocess.Popen, kill_on_hang: bool, say, shout,
                 kill_grace: float = KILL_GRACE_S) -> None:
        self.dump_dir, self.child, self.kill_on_hang, self.kill_grace = dump_dir, child, kill_on_hang, kill_grace
        self.say, self.shout = say, shout  # stderr (what run does), stdout (verdicts)
        self.headers: dict[int, dict] = {}
        self._stamps: dict[str, tuple[int, int]] = {}
        self._by_path: dict[str, dict] = {}
        self._old: dict[str, tuple[int, int]] = {}
        self.episode: dict | None = None
        self.started = time.time()
        self.closed_at = self.started  # a hang detected before this run started is an older run's
        self.resumed = False  # closed_at is a resume's (not the start's)
        self.verdicts = 0
        self.printed_stamps: dict | None = None  # the dump files a printed verdict was made from
        self._requests = 0
        self._kill_at: float | None = None
        self.live = RunLive(dump_dir, say)  # every rank's state through the job's store (recorder/run_live.py)
        self.last_findings: list | None = None  # the findings of the last verdict printed
        self.launch = None  # the launcher's account read with them (trace/loaders/launcher_log.py), if any
        self.hung_verdict: tuple | None = None  # (detected_at, findings) printed while the job hung

    # ---- while the job runs --------------------------------------------------------------------------------
    def poll(self) -> None:
        for rank in self._scan():
            self._consider(self.headers[rank])
        self.live.look()
        for header in self.live.hang_headers():  # a rank on any host that reports a hang opens the episode here
            self._consider(header)
        ep = self.episode
        if ep is not None and not ep["printed"] and (self._all_dumped(ep) or time.time() >= ep["deadline"]):
            self._print_verdict(ep)
        if self._kill_at is not None and time.time() >= self._kill_at and self.child.poll() is None:
            self.say("the command did not stop within "
                     f"{self.kill_grace:g} s of SIGTERM: killing it and its ranks")
            signal_ranks(self.dump_dir, signal.SIGKILL)
            self.child.kill()
            self._kill_at = None

    def _scan(self) -> list[int]:
        changed = []
        for path in layout.find(self.dump_dir, "rank_*.jsonl"):
            try:
                st = os.stat(path)
            except OSError:
                continue
            stamp = (st.st_mtime_ns, st.st_size)
            if self._stamps.get(path) == stamp or self._old.get(path) == stamp:
                continue
            header = read_header(path)
            if header is None:
                continue
            if (header.get("dump_time") or 0) < self.started - 1:
                self._old[path] = stamp  # a dump of an earlier run in a reused directory
                continue
            self._stamps[path] = stamp
            self._by_path[path] = header
            self.headers[header["rank"]] = header
            changed.append(header["rank"])
        return changed

    def _consider(self, header: dict) -> None:
        hang = header.get("hang")
        if not isinstance(hang, dict) or hang.get("status") not in ORDER:
            return
        status, ep = hang["status"], self.episode
        if status == "resumed":
            if ep is not None and (hang.get("resumed_at") or 0) >= ep["detected_at"]:
                if not ep["printed"]:
                    self._print_verdict(ep)
                self.shout(f"distdoctor run: resumed after {hang.get('resumed_after_s', 0):.1f} s: rank "
                           f"{header['rank']} made progress again (hang {ep['status']} at {_clock(ep['detected_at'])})"
                           "; still watching.")
                self.closed_at = hang.get("resumed_at") or time.time()
                self.resumed = True
                self.episode = None
                self.hung_verdict = None
            return
        if not self._after_close(hang, RESUME_RACE_S if self.resumed else 0.0):
            return  # a dump made for an episode that has resumed since
        if ep is None or ORDER[status] > ORDER[ep["status"]]:
            self._fan_out(header["rank"], hang)

    def _fan_out(self, rank: int, hang: dict) -> None:
        status = hang["status"]
        self._requests += 1
        episode = {k: v for k, v in hang.items() if k != "this_rank"}
        mine = hang.get("this_rank") or {}
        where = mine.get("blocked_in") or hang.get("blocked_in")
        what = (f"{where['op']} #{where['seq']} on group {where['group']} in flight for "
                f"{mine.get('blocked_for_s') or 0:.1f} s") if where else "no collective progress"
        bound = (f"during start-up; start timeout {hang.get('start_timeout_s') or 0:g} s" if hang.get("start_up") else
                 f"hang timeout {hang.get('hang_timeout_s') or 0:g} s")
        reason = (f"hang suspected on rank {rank}: {what}" if status == "suspected" else
                  f"hang: confirmed on rank {rank}: {what} ({bound})")
        todo = sorted(r for r in registered_ranks(self.dump_dir) if not self._dumped_for(r, status))
        request = {"id": f"{socket.gethostname()}:{os.getpid()}:{self._requests}", "status": status, "ranks": todo,
                   "hang": episode, "reason": reason + "; dumped at distdoctor run's request"}
        try:
            write_atomic(os.path.join(self.dump_dir, REQUEST_FILE), json.dumps(request).encode())
        except OSError as exc:
            self.say(f"warning: cannot write the dump request ({exc}); only the ranks that saw the hang dumped")
        signal_ranks(self.dump_dir, signal.SIGUSR1, ranks=set(todo))
        now = time.time()
        # A confirmed hang is printed at the time it was confirmed (the episode began when it was suspected).
        at = (hang.get("confirmed_at") if status == "confirmed" else None) or hang.get("detected_at") or now
        self.episode = {"status": status, "detected_at": hang.get("detected_at") or now, "at": at, "rank": rank,
                        "deadline": now + FANOUT_WAIT_S, "printed": False, "start_up": bool(hang.get("start_up"))}

    def _after_close(self, hang: dict, slack: float = 0.0) -> bool:
        """Whether a rank's hang report is about the job as it is now, not about an episode that resumed since:
        detected after the resume (`slack` later, for a report: a rank that saw the same stall a moment before it
        cleared), or confirmed after it. One rank's progress does not end another's hang: a rank whose own clock
        then ran the whole hang timeout without progress is hung, whatever the rank that resumed did."""
        if (hang.get("detected_at") or 0) > self.closed_at + slack:
            return True
        return hang.get("status") == "confirmed" and (hang.get("confirmed_at") or 0) > self.closed_at

    def _dumped_for(self, rank: int, status: str) -> bool:
        hang = (self.headers.get(rank) or {}).get("hang")
        return (isinstance(hang, dict) and hang.get("status") in ORDER and ORDER[hang["status"]] >= ORDER[status]
                and self._after_close(hang))

    def _all_dumped(self, ep: dict) -> bool:
        host = socket.gethostname()
        return all(self._dumped_for(r, ep["status"]) for r, (pid, where) in registered_ranks(self.dump_dir).items()
                   if where != host or alive(pid))

    def _print_verdict(self, ep: dict) -> None:
        ep["printed"] = True
        status = ep["status"]
        late = [r for r in registered_ranks(self.dump_dir) if not self._dumped_for(r, status)]
        self.shout("")
        since = f" (suspected at {_clock(ep['detected_at'])})" if ep.get("at", ep["detected_at"]) != ep["detected_at"] \
            else ""
        phase = " DURING START-UP" if ep.get("start_up") else ""  # a member never reached its first collective
        self.shout(f"distdoctor run: HANG {status.upper()}{phase} at {_clock(ep.get('at', ep['detected_at']))}{since}; every "
                   "rank was asked to dump"
                   + (f" ({_ranks(late)} did not within {FANOUT_WAIT_S:g} s)" if late else "")
                   + (". The job keeps running." if status == "suspected" or not self.kill_on_hang else "."))
        pointer = self.live.pointer()
        self.shout(f"distdoctor run: {pointer}" if pointer else self.report_text(problem=f"hang {status}", live=True),
                   nl=pointer is not None)
        self.hung_verdict = (ep["detected_at"], list(self.last_findings or []))
        self.verdicts += 1
        self.printed_stamps = dict(self._stamps)
        if status == "confirmed" and self.kill_on_hang and self.child.poll() is None:
            self.shout("distdoctor run: stopping the job (--kill-on-hang): SIGTERM to the command.")
            try:
                self.child.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            self._kill_at = time.time() + self.kill_grace
        elif status == "suspected":
            self.shout("distdoctor run: watching for progress; a hang is confirmed after --hang-timeout "
                       f"({_hang_timeout(self.headers)}) without progress.")

    def stop_orphans(self, grace_s: float = ORPHAN_GRACE_S) -> list[int]:
        """The command ended but some of its ranks still run (torchrun starts each in its own session, so a
        launcher killed without cleaning up leaves them behind, blocked forever in a hang): stop them, SIGTERM
        (they dump) then SIGKILL. Returns the ranks stopped."""
        host = socket.gethostname()
        left = {r: pid for r, (pid, where) in registered_ranks(self.dump_dir).items() if where == host and alive(pid)}
        if not left:
            return []
        self.say(f"{_ranks(left)} still running after the command ended (its launcher is gone): stopping them")
        for pid in left.values():
            # a stopped process (SIGSTOP) cannot act on SIGTERM: waiting for it would only wait
            _kill(pid, signal.SIGKILL if stopped(pid) else signal.SIGTERM)
        deadline = time.time() + grace_s
        while time.time() < deadline and any(alive(pid) for pid in left.values()):
            time.sleep(0.1)
        for pid in left.values():
            if alive(pid):
                _kill(pid, signal.SIGKILL)
        return sorted(left)

    # ---- analysis ------------------------------------------------------------------------------------------
    def report_text(self, problem: str | None = None, live: bool = False) -> str:
        """diagnose's text report of the dumps (`live`: of every rank's live state, when rank 0 runs here and its
        store answers); when `problem` is known (a hang, a crash, a failed command) and the traces alone look
        fine, the verdict line says the problem instead of OK."""
        try:
            from distdoctor.diagnose.analyze import analyze
            from distdoctor.report.diagnose_text import render_text
            from distdoctor.trace.loaders import load_traces
        except ImportError:
            return ""
        extra: list[str] = []
        try:
            got = self.live.evidence() if live else None
            if got is not None:
                report, extra = got
            else:
                traces = load_traces([self.dump_dir])
                if not traces.ranks:
                    return ""
                report = analyze(traces)
            self.last_findings = report.findings
            self.launch = getattr(getattr(report, "traces", None), "launch", None)
            text = render_text(report) + "".join(ln + "\n" if ln.endswith(":") else f"  {ln}\n" for ln in extra)
        except Exception as exc:  # the job's exit code and the dumps matter more than this summary
            self.say(f"warning: could not analyze the dumps ({type(exc).__name__}: {exc})")
            return ""
        if problem and report.verdict in ("ok", "undecided"):
            keep = [ln for ln in text.splitlines() if not ln.startswith("No desync, hang or straggler found")]
            if keep and keep[0].startswith(("verdict: OK", "verdict: UNDECIDED")):
                rest = keep[0].split(" - ", 1)[-1].split("; ", 1)[-1]
                keep[0] = f"verdict: PROBLEM - {problem} (no finding in the traces themselves); {rest}"
            text = "\n".join(keep) + "\n"
        return text

    # ---- when the job ended --------------------------------------------------------------------------------
    def closing_report(self, rc: int) -> None:
        self._scan()
        # the first to die first: the others often died of it (a peer's connection closed)
        crashed = {r: h for r, h in sorted(self.headers.items(), key=lambda x: (x[1].get("dump_time") or 0, x[0]))
                   if _crash(h)}
        problem = None
        if crashed or rc != 0:
            problem = "; ".join(_crash_lines(crashed) + ([f"the command exited with code {rc}"] if rc != 0 else []))
        before = self.printed_stamps or {}
        changed = [p for p, st in self._stamps.items() if before.get(p) != st]
        # dumps only rewritten to say a printed hang resumed: run already said so, and they still show that moment
        resumes_only = self.printed_stamps is not None and all(
            str(self._by_path[p].get("dump_reason") or "").startswith("hang resumed") for p in changed)
        if self.headers and changed and (problem or not resumes_only):
            self.shout("")
            self.shout(self.report_text(problem), nl=False)
        if problem and self.last_findings:  # the verdict's culprit, not every rank that raised after it
            problem = "; ".join([_culprit(self._closing_first(), crashed, self.launch)]
                                + ([f"the command exited with code {rc}"] if rc != 0 else []))
        if problem:
            self.shout(f"distdoctor run: the job failed: {problem}.")
        elif self.verdicts:
            self.shout("distdoctor run: the job ended with exit code 0.")

    def _closing_first(self):
        """The closing verdict's first finding, unless it blames ranks that crashed only after the hang was seen
        (they cannot have caused it): then the finding printed while the job hung, whose evidence is closer to
        the cause. Never less right than the live verdict."""
        first = self.last_findings[0]
        if self.hung_verdict is None or not self.hung_verdict[1] or first.kind != "crashed":
            return first
        seen_at = self.hung_verdict[0]
        if all((self.headers.get(r) or {}).get("dump_time", 0) > seen_at for r in first.ranks):
            return self.hung_verdict[1][0]
        return first

    def clean_up(self, created_dir: bool) -> None:
        """Remove what ranks left behind here (remove_leftovers) and the live watcher's files; the directory itself
        when empty and made by us."""
        remove_leftovers(self.dump_dir)
        self.live.clean_up()
        if created_dir:
            try:
                for sub in layout.host_dirs(self.dump_dir):
                    _rmdir_if_empty(sub)
                os.rmdir(self.dump_dir)  # only when empty
            except OSError:
                pass


def _crash(header: dict) -> str | None:
    exc = header.get("exception")
    if isinstance(exc, dict) and exc.get("type"):
        where = f" (in {exc['where']})" if exc.get("where") else ""
        thread = f" in thread {exc['thread']}" if exc.get("thread") not in (None, "MainThread") else ""
        return f"{exc['type']}: {str(exc.get('message', ''))[:200]}{thread}{where}"
    reason = header.get("dump_reason") or ""
    return reason[len("exception: "):] if reason.startswith("exception: ") else None


def _crash_lines(crashed: dict) -> list[str]:
    """Without a verdict: the ranks that crashed on their own, else (all of them died of communicating) the
    first to die; the others are counted, not named, since they died of it."""
    from distdoctor.world.failures import is_comm_failure

    own = [r for r, h in crashed.items() if not is_comm_failure(_crash(h) or "")]
    named = own or list(crashed)[:1]
    lines = [f"rank {r} crashed: {_crash(crashed[r])}" for r in named]
    if len(crashed) > len(named):
        lines.append(f"{len(crashed) - len(named)} other rank(s) died after it of a communication failure")
    return lines


def _culprit(finding, crashed: dict, launch=None) -> str:
    """The verdict's first finding, in the closing line: its ranks and kind (and the exception, if one of them
    crashed; how the launcher says a rank that left no dump ended); the ranks that died after it are counted, not
    named. A finding that cannot decide between ranks says so: "one of ranks ...", never a claim."""
    suspects = finding.evidence.get("suspects") or finding.ranks
    who = f"one of {_ranks(suspects)}" if finding.evidence.get("undecided") and len(suspects) > 1 \
        else _ranks(finding.ranks)
    own = [r for r in finding.ranks if r in crashed]
    if finding.kind == "crashed" and own:
        text = f"{who} crashed: {_crash(crashed[own[0]])}"
    else:
        text = f"{who}: {finding.kind.replace('_', ' ')}"
        if finding.op:
            text += f" at {finding.op}" + (f" #{finding.seq}" if finding.seq is not None else "") \
                + (f" on group '{finding.group}'" if finding.group is not None else "")
        if own:
            text += f" ({_crash(crashed[own[0]])})"
        elif (how := _launcher_says(finding.ranks, launch)) is not None:
            text += f" ({how})"
    others = [r for r in crashed if r not in finding.ranks]
    if others:
        text += f"; {len(others)} other rank(s) died after it"
    return text


def _launcher_says(ranks: list[int], launch) -> str | None:
    """How the launcher's log says the finding's one rank ended, when a signal or an exit code of its own did
    (the rank's dump, if any, could not say)."""
    ended = launch.ranks.get(ranks[0]) if launch is not None and len(ranks) == 1 else None
    if ended is None or ended.stopped:
        return None
    if ended.signal:
        return f"ended by {ended.signal}, says the launcher's log"
    if ended.ended == "exit":
        return f"exit code {ended.exitcode}, says the launcher's log"
    return None


def _hang_timeout(headers: dict) -> str:
    for h in headers.values():
        hang = h.get("hang")
        if isinstance(hang, dict) and hang.get("hang_timeout_s"):
            return f"{hang['hang_timeout_s']:g} s"
    return "its value"


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def remove_leftovers(dump_dir: str) -> None:
    """Remove pid files of ranks on this host that are gone (killed before they could), the dump request, and
    temporary files of writers that died. At the end of a run, and at the start of the next one in the same
    directory: a `distdoctor run` killed with SIGKILL could not remove them itself."""
    host = socket.gethostname()
    for path in layout.find(dump_dir, ".rank_*.pid"):
        registered = registered_ranks_in([path])
        if any(where == host and not alive(pid) for pid, where in registered.values()):
            _unlink(path)
    _unlink(os.path.join(dump_dir, REQUEST_FILE))
    for path in layout.find(dump_dir, ".*.tmp-*"):
        try:
            pid = int(path.rsplit(".tmp-", 1)[1].split("-")[0])
        except (ValueError, IndexError):
            continue
        if not alive(pid):
            _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _rmdir_if_empty(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass
