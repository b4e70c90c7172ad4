"""The launcher's account of how each rank ended, read from torchrun's console log (torch.distributed.elastic).

Every job started by torchrun leaves this log, whatever else it dumped; a Flight Recorder dump holds no word of
how its process ended, and Gloo's holds no send/recv at all. The log says:
- which ranks failed, each with its exit code or the signal that ended it, its pid and host (the `Failures:` and
  `Root Cause (first observed failure):` blocks of the ChildFailedError summary);
- which ranks the launcher itself stopped (`Sending process <pid> closing signal SIGTERM`): once one worker
  fails, the agent signals every worker still running. Those ranks ended because another failed, or because the
  agent was told to stop (`Received 15 death signal, shutting down workers`: every rank is then stopped);
- what each rank raised: its traceback, every line prefixed `[rankN]:` by torchrun (the exception's type and
  message, and its frames, innermost last);
- the first failure the agent saw (`failed (exitcode: C) local_rank: L (pid: P)`), with its time.

So each rank gets one line of the account: `ended` is how ("exception", "signal", "exit", "stopped": the
launcher's signal), with what the log shows of it. A rank the agent found failed before it signalled the rest
ended on its own; one it signalled did not (unless it had raised already: its traceback says so, and the
exception is what ended it). An exit code of 1 with no traceback in the log is an exception the log does not
show (a log cut at its start loses the first tracebacks, the culprit's among them): `unshown`, never an exit of
its own; the analysis weighs it (diagnose/crash.py: the only rank that went before the launcher's signal).
Several files (one agent per host) are one account. Detected by content: the elastic agent's log lines, its
failure summary, or torchrun's `[rankN]:` prefixes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from distdoctor.trace.model import Frame

_MARKS = re.compile(rb"torch/distributed/elastic/|torch\.distributed\.elastic|ChildFailedError|"
                    rb"Root Cause \(first observed failure\)")
_PREFIXED = re.compile(rb"(?m)^\[rank(\d+)\]:")
_PREFIX = re.compile(r"^\[rank(\d+)\]:\s?(.*)$")
_SENDING = re.compile(r"Sending process (\d+) closing signal (SIG\w+)")
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_DEATH = re.compile(r"Received (\d+) death signal, shutting down workers")
_FIELD = re.compile(r"^\s+(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*?)\s*$")
_RANK_FIELD = re.compile(r"(\d+) \(local_rank: (\d+)\)")
_EXIT_FIELD = re.compile(r"(-?\d+) \(pid: (\d+)\)(?:\s+\((SIG\w+)\))?")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+), in (.*)$')
_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$")  # the first line after the frames: `Type: message`
_GLOG_TIME = re.compile(r"^[IWEF](\d{4}) (\d\d:\d\d:\d\d\.\d+) ")
SIGNALS = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
SHELL_SIGNAL = 128  # an exit code of 128 + n: a handler of signal n exited so (the shell's convention)
UNTOLD = "To enable traceback see"  # the summary's traceback field when no error file was written


@dataclass
class Ended:
    """One rank's line of the launcher's account."""
    rank: int
    exitcode: int | None = None
    signal: str | None = None  # the signal that ended the process (negative exit code), as the summary names it
    pid: int | None = None
    host: str | None = None
    stopped: bool = False  # the launcher signalled it (it was still running when another failed)
    first_seen: bool = False  # the failure the agent saw first (`failed (exitcode: ...)`)
    exception: str | None = None  # "Type: message", the last exception its traceback shows
    frames: list[Frame] = field(default_factory=list)  # that traceback's frames, innermost last

    @property
    def ended(self) -> str:
        """How the rank ended, as far as the log shows: exception | signal | exit | stopped | unshown (exit code 1,
        Python's for an uncaught exception, whose traceback the log does not hold) | unknown."""
        if self.exception:
            return "exception"
        if self.stopped:
            return "stopped"
        if self.signal:
            return "signal"
        if self.exitcode not in (None, 0, 1):
            return "exit"
        return "unshown" if self.exitcode == 1 else "unknown"

    def to_json(self) -> dict:
        out = {"ended": self.ended, "exitcode": self.exitcode, "signal": self.signal, "pid": self.pid,
               "host": self.host, "stopped_by_launcher": self.stopped, "first_seen": self.first_seen}
        if self.exception:
            out["exception"] = self.exception
        return out


@dataclass
class LaunchLog:
    """What one launcher log (or several, merged) says of the job's ranks."""
    path: str
    ranks: dict[int, Ended] = field(default_factory=dict)
    told_to_stop: bool = False  # the agent itself was signalled: every rank it stopped, it stopped on request
    first_seen_at: str | None = None  # the time of the agent's first failure line (its glog stamp)
    judged: dict = field(default_factory=dict, repr=False, compare=False)  # what an analysis read of it, once

    def merge(self, other: LaunchLog) -> None:
        self.path = f"{self.path}, {other.path}"
        for rank, ended in other.ranks.items():
            self.ranks.setdefault(rank, ended)
        self.told_to_stop = self.told_to_stop or other.told_to_stop

    def to_json(self) -> dict:
        return {"path": self.path, "told_to_stop": self.told_to_stop, "first_seen_at": self.first_seen_at,
                "ranks": {str(r): e.to_json() for r, e in sorted(self.ranks.items())}}



def looks_like_launcher_log(head: bytes, tail: bytes) -> bool:
    """torchrun's console log: the elastic agent's lines or summary, or several ranks' `[rankN]:` prefixes."""
    if b"\0" in head or head.lstrip()[:1] == b"{":  # (a Flight Recorder JSON dump: never scanned further)
        return False
    if _MARKS.search(head) or _MARKS.search(tail):
        return True
    return len(set(_PREFIXED.findall(head))) >= 2


def load_launcher_log(data: bytes, path: str) -> LaunchLog:
    """The account one log gives; ValueError(reason) when it names no rank's end. A job stopped from outside
    (the agent signalled: it raises no ChildFailedError, so no summary) is an account of its own: every rank
    stopped, none named."""
    log = LaunchLog(path=path)
    waved: set[int] = set()  # pids the launcher signalled
    first_pid = None
    tracebacks: dict[int, list[str]] = {}
    lines = data.decode("utf-8", "surrogateescape").splitlines()
    block = None
    for line in lines:
        if m := _PREFIX.match(line):
            tracebacks.setdefault(int(m.group(1)), []).append(m.group(2))
            continue
        if m := _SENDING.search(line):
            waved.add(int(m.group(1)))
        elif m := _FAILED.search(line):
            first_pid = int(m.group(3))
            t = _GLOG_TIME.match(line)
            log.first_seen_at = t.group(2) if t else None
        elif _DEATH.search(line):
            log.told_to_stop = True
        elif re.match(r"^\[\d+\]:\s*$", line):
            block = {}
            continue
        if block is not None and (m := _FIELD.match(line)):
            block[m.group(1)] = m.group(2)
            if m.group(1) == "traceback":
                _add_failure(log, block)
                block = None
    for rank, ended in log.ranks.items():
        ended.stopped = ended.pid in waved or log.told_to_stop
        ended.first_seen = first_pid is not None and ended.pid == first_pid
        exc, frames = last_exception(tracebacks.get(rank, []))
        if exc is not None:
            ended.exception, ended.frames = exc, frames
    for rank, tb in tracebacks.items():  # a rank that raised and that the summary does not list (it exited 0?)
        if rank not in log.ranks and (got := last_exception(tb))[0] is not None:
            log.ranks[rank] = Ended(rank, exception=got[0], frames=got[1])
    if not log.ranks and not log.told_to_stop:
        raise ValueError("a torchrun log, but it names no rank's end (no failure summary, no traceback)")
    return log


def _add_failure(log: LaunchLog, block: dict) -> None:
    rank = _RANK_FIELD.match(block.get("rank", ""))
    code = _EXIT_FIELD.match(block.get("exitcode", ""))
    if rank is None or code is None:
        return
    exitcode = int(code.group(1))
    signal = code.group(3) or (SIGNALS.get(-exitcode, f"signal {-exitcode}") if exitcode < 0 else
                               SIGNALS.get(exitcode - SHELL_SIGNAL) if exitcode > SHELL_SIGNAL else None)
    ended = Ended(int(rank.group(1)), exitcode=exitcode, signal=signal, pid=int(code.group(2)),
                  host=block.get("host"))
    log.ranks.setdefault(ended.rank, ended)  # (the root cause is listed again under its own heading)
    told = block.get("traceback", "")
    if told and not told.startswith((UNTOLD, "Signal ", "Traceback")) and not ended.exception:
        ended.exception = told  # an error file's message (@record), when the rank wrote one (its traceback, over
        # several lines, is not read here: the rank's own `[rankN]:` lines hold it)


def last_exception(lines: list[str]) -> tuple[str | None, list[Frame]]:
    """("Type: message", frames innermost last) of the last traceback in one rank's prefixed lines."""
    start = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")),
                default=None)
    if start is None:
        return None, []
    frames: list[Frame] = []
    for ln in lines[start + 1:]:
        if m := _FRAME.match(ln):
            frames.append(Frame(m.group(3), m.group(1), int(m.group(2))))
        elif ln[:1].isspace() or not ln.strip():
            continue
        elif m := _EXC_LINE.match(ln.strip()):
            kind, message = m.group(1), " ".join((m.group(2) or "").split())
            return (f"{kind}: {message}" if message else kind), frames
        else:
            break
    return None, frames


def apply_account(ts, log: LaunchLog) -> None:
    """Each rank's line of the account, on its trace (`launch`); and where the rank's own dump says nothing of its
    end (a Flight Recorder dump never does; a recorder's `exit: ...` may lack the code), the account's word as
    the dump's would be: the exception it raised
    (type, message, its traceback as the stack 'exception in MainThread'), `signal: SIG...` for a signal the
    launcher did not send, an exit code of its own. A rank the launcher stopped gets nothing more: it was ended
    because another rank failed first (or the job was stopped). Ranks with no dump stay absent."""
    ts.launch = log
    for rank, ended in log.ranks.items():
        trace = ts.ranks.get(rank)
        if trace is None:
            continue
        trace.launch = ended.to_json()
        how, reason = ended.ended, trace.dump_reason or ""
        if trace.exception or reason.startswith(("exception", "signal")) or (reason and how != "exit"):
            continue  # its own dump said how it ended, first-hand; only an exit code adds to `exit: ...`
        if how == "exception":
            kind, _, message = ended.exception.partition(": ")
            trace.exception = {"type": kind, "message": message, "thread": "MainThread",
                               "exit_code": ended.exitcode if ended.exitcode is not None else 1,
                               "told_by": "the launcher's log"}
            trace.dump_reason = f"exception: {ended.exception}"
            if ended.frames and not any(name.startswith("exception in ") for name in trace.stacks or {}):
                trace.stacks = {**(trace.stacks or {}), "exception in MainThread": list(ended.frames)}
        elif how == "signal":
            trace.dump_reason = f"signal: {ended.signal}"
        elif how == "exit":
            trace.exception = {"type": "exited on its own", "thread": "MainThread",
                               "message": "no exception in the launcher's log, no signal",
                               "exit_code": ended.exitcode, "told_by": "the launcher's log"}
