"""Per-rank progress: what each rank completed and where it is now — the summary otherwise built from logs.

For every rank: collectives completed per group, the last completed collective, the blocking entry (oldest
incomplete, see waitfor.py) with its age at dump time, where it was called from (the innermost frame outside
torch, when the dump has frames), the current Python stack of its main thread (native dumps), and training
steps when the collective sequence is periodic: the period is the distance between repeats of the first
signature (group, op), confirmed over the whole trace; steps = completed entries // period.
"""

from __future__ import annotations

from distdoctor.collectives import canonical_op
from distdoctor.findings.kinds import numbered
from distdoctor.trace.code_origin import is_torch, is_user_code
from distdoctor.trace.model import Entry, Frame, RankTrace
from distdoctor.trace.summary import summarize
from distdoctor.world.failures import raised_unpacking

def user_frame(frames: list[Frame]) -> Frame | None:
    """Innermost frame that is neither torch's own nor the standard library's (frames are innermost last)."""
    for f in reversed(frames):
        if is_user_code(f.filename):
            return f
    return frames[-1] if frames else None


def main_stack(trace: RankTrace) -> tuple[str, list[Frame]] | None:
    if not trace.stacks:
        return None
    for prefix in ("MainThread", "main", "python"):  # the recorder names threads "MainThread (<ident>)"
        for name, frames in trace.stacks.items():
            if name == prefix or name.startswith(prefix + " "):
                return name, frames
    name = next(iter(trace.stacks))
    return name, trace.stacks[name]


def _innermost_user(frames: list[Frame]) -> str | None:
    for f in reversed(frames):
        if is_user_code(f.filename):
            return str(f)
    return str(frames[-1]) if frames else None


def where_now(trace: RankTrace) -> str | None:
    """The innermost user frame of the main thread's current stack (stacks are innermost last). A simulated
    trace has one pseudo-thread per stream and no main thread: then every stream's position, by name."""
    if trace.stacks and trace.source == "simulated":
        parts = [f"{name}: {_innermost_user(frames)}" for name, frames in trace.stacks.items() if frames]
        return "; ".join(parts) or None
    got = main_stack(trace)
    if not got:
        return None
    return _innermost_user(got[1])


EXCEPTION_PREFIX = "exception:"  # the recorder's dump_reason of an uncaught exception: "exception: Type: message"


def crash_of(trace: RankTrace | None) -> dict | None:
    """How the rank died, when its dump says it died of an exception: the exception's type and message, where it
    was raised (the innermost user frame of its traceback, which the recorder dumps as a stack named
    'exception in <thread>'; `where`: the innermost frame of all, torch's or not), the thread, the exit code,
    and the call it was in when a collective or p2p raised it.

    The recorder's `exception` header says it best (type, message, thread, where, exit_code); older dumps only
    have `dump_reason` ("exception: Type: message"). An exception that ended a thread other than the main one
    (exit_code null) did not end the process: the rank is still running, and this returns None (see
    thread_exception)."""
    if trace is None:
        return None
    exc = trace.exception if isinstance(trace.exception, dict) and trace.exception.get("type") else None
    reason = trace.dump_reason or ""
    if exc is not None:
        if exc.get("exit_code") is None and str(exc.get("thread") or "MainThread") != "MainThread":
            return None
        message = " ".join(str(exc.get("message") or "").split())
        kind = str(exc["type"])
        out: dict = {"type": kind, "message": message, "text": f"{kind}: {message}" if message else kind,
                     "exit_code": exc.get("exit_code"), "thread": exc.get("thread") or "MainThread"}
        if exc.get("where"):
            out["where"] = str(exc["where"])
    elif reason.startswith(EXCEPTION_PREFIX):
        text = reason[len(EXCEPTION_PREFIX):].strip()
        kind, _, message = text.partition(": ")
        out = {"type": kind, "message": message, "text": text}
    else:
        return None
    innermost = out.get("where")
    for name, frames in (trace.stacks or {}).items():
        if name.startswith("exception in ") and frames:
            out["at"] = _innermost_user(frames)
            out.setdefault("thread", name[len("exception in "):])
            innermost = innermost or str(frames[-1])
            break
    if raised_unpacking(innermost, out["type"]):
        out["unpacking"] = True  # of the bytes a peer sent: a communication failure, whatever its text
    # The call that raised it: the rank's last entry that recorded an error (only the recorder records them).
    for i in reversed(summarize(trace).not_done[-64:]):
        e = trace.entries[i]
        if e.error:
            out["in_call"] = e
            break
    return out


def thread_exception(trace: RankTrace | None) -> dict | None:
    """An exception that ended a thread other than the main one (the process went on), from the header."""
    exc = trace.exception if trace is not None and isinstance(trace.exception, dict) else None
    if exc and exc.get("type") and exc.get("exit_code") is None and \
            str(exc.get("thread") or "MainThread") != "MainThread":
        return {k: exc.get(k) for k in ("type", "message", "thread", "where")}
    return None


def crash_phrase(crash: dict) -> str:
    """'crashed (exit code 1): ValueError: bad config, raised at forward (model.py:41)'."""
    text = crash["text"] if len(crash["text"]) <= 200 else crash["text"][:197] + "..."
    where = f", raised at {crash['at']}" if crash.get("at") else \
        f", raised in {crash['where']}" if crash.get("where") else ""
    code = f" (exit code {crash['exit_code']})" if crash.get("exit_code") is not None else ""
    e = crash.get("in_call")
    inside = f" inside {e.op} #{e.seq if not e.is_p2p else e.p2p_seq} on group '{e.group}'" if e is not None else ""
    return f"crashed{code}: {text}{inside}{where}"


def probably_inside(trace: RankTrace | None, e: Entry) -> bool:
    """A rank that left only its recorder trace (which cannot see calls issued from C++, such as DDP's gradient
    all_reduces), whose main thread is inside torch at dump time while its trace shows it in no call, for a call
    only Flight Recorder saw (its name keeps the backend: `gloo:all_reduce`): it is probably in that call.
    Blaming it for never issuing it would blame the innocent."""
    if trace is None or trace.source != "native" or not e.raw_op or ":" not in e.raw_op:
        return False
    if e.seq is not None and trace.would_show(e.group, e.seq):
        return False  # aligned among the Flight Recorder ranks' calls: one its recorder would have shown
    if summarize(trace).not_done or watched_idle(trace):
        return False  # the trace shows a call it is in (or left open), or its watchdog saw it in none
    got = main_stack(trace)
    return bool(got and got[1]) and is_torch(got[1][-1].filename)


def outside_torch(trace: RankTrace | None) -> bool:
    """A rank that left only its recorder trace, shown in no call, whose main thread is outside torch at dump
    time, or whose own watchdog saw no call in flight: it is in no collective at all, not even one issued from
    C++ that its trace cannot see."""
    if trace is None or trace.source != "native" or summarize(trace).not_done:
        return False
    got = main_stack(trace)
    return watched_idle(trace) or (bool(got and got[1]) and not is_torch(got[1][-1].filename))


def in_no_collective(trace: RankTrace | None) -> bool:
    """A rank its dump shows in no collective at all: Flight Recorder's (alone, or merged with the recorder's:
    it holds the calls issued from C++ too) has none open; the recorder's alone is `outside_torch`."""
    if trace is None or summarize(trace).not_done:
        return False
    return trace.numbered_by_communicator or outside_torch(trace)


def header_call(trace) -> dict | None:
    """The call this rank's own watchdog saw it blocked in, for a dump of a suspected or confirmed hang."""
    hang = trace.hang if isinstance(trace.hang, dict) else None
    if not hang or hang.get("status") not in ("suspected", "confirmed"):
        return None
    call = (hang.get("this_rank") or {}).get("blocked_in")
    if not isinstance(call, dict) or call.get("group") is None or call.get("seq") is None:
        return None
    op = canonical_op(str(call.get("op") or ""))
    return {**call, "group": str(call["group"]), "op": op} if op else None


def watched_past(seq: int, op: str, at_seq: int, at_op: str) -> bool:
    """A watchdog that saw its rank in collective (seq, op) of a group saw it reach collective (at_seq, at_op) of
    that group: the very call (the same number and op: another op there is another call) or a later one."""
    return seq > at_seq or (seq == at_seq and op == at_op)


def watched_idle(trace: RankTrace) -> bool:
    """The rank's own hang watchdog, which reads its process's Flight Recorder (the episode names a call by its
    `flight_recorder` source: the job's recorder reads it), saw no call in flight, C++'s included, when it
    dumped for the hang (`this_rank.blocked_in` empty). A stack inside torch (a DataLoader, the optimizer) says
    nothing against it."""
    hang = trace.hang if isinstance(trace.hang, dict) else {}
    mine, episode = hang.get("this_rank"), hang.get("blocked_in")
    return isinstance(mine, dict) and "blocked_in" in mine and mine["blocked_in"] is None and \
        mine.get("idle_for_s") is not None and isinstance(episode, dict) and episode.get("source") == "flight_recorder"


def last_completed(trace: RankTrace) -> Entry | None:
    """The rank's last entry marked completed (found from the state column, from the end)."""
    i = summarize(trace).last_done
    return None if i is None else trace.entries[i]


def entry_json(e: Entry, dump_time: float | None = None) -> dict:
    out = {"group": e.group, "seq": e.seq if not e.is_p2p else e.p2p_seq, "op": e.op, "state": e.state,
           "in_sizes": e.in_sizes, "dtypes": e.in_dtypes}
    if e.peer is not None:
        out["peer"] = e.peer
    f = user_frame(e.frames)
    if f:
        out["called_from"] = str(f)
    if dump_time and e.t_created:
        out["waiting_s"] = round(dump_time - e.t_created, 3)
    return out


def rank_progress(trace: RankTrace, pending: list[Entry]) -> dict:
    summary = summarize(trace)
    completed = dict(summary.completed)
    last_done = trace.entries[summary.last_done_collective] if summary.last_done_collective is not None else None
    out: dict = {
        "source": trace.source, "path": trace.path, "entries": len(trace.entries),
        "completed": completed,
        "last_completed": entry_json(last_done) if last_done else None,
        "pending": [entry_json(e, trace.dump_time) for e in pending],
        "last_issued": entry_json(trace.entries[-1]) if trace.entries else None,
        "dump_reason": trace.dump_reason,
    }
    st = summary.steps
    if st:
        out["steps"], out["collectives_per_step"] = st
    now = where_now(trace)
    if now:
        out["now"] = now
        name, frames = main_stack(trace) or ("", [])
        out["stack"] = {"thread": name, "frames": [str(f) for f in frames[-12:]]}
    crash = crash_of(trace)
    if crash:
        out["crash"] = {k: v for k, v in crash.items() if k != "in_call"}
    dead_thread = thread_exception(trace)
    if dead_thread:
        out["thread_exception"] = dead_thread
    if trace.merged:
        out["merged"] = trace.merged
    if trace.launch:
        out["launch"] = trace.launch  # how the launcher's log says it ended
    return out


def describe_rank(rank: int, trace: RankTrace | None, pending: list[Entry], note: str = "") -> str:
    """One phrase: what the rank did last and where it is now (or what it died of); `note` says more about the
    call it is in."""
    if trace is None:
        return f"rank {rank} left no trace"
    crash = crash_of(trace)
    parts = [crash_phrase(crash)] if crash else []
    e = last_completed(trace)
    if e is not None:
        what = "call" if e.is_p2p else "collective"
        parts.append(f"its last completed {what} was {e.op} #{e.seq if not e.is_p2p else e.p2p_seq} "
                     f"on group '{e.group}'")
    elif not trace.entries:
        parts.append("it recorded no collective at all")
    if pending and not crash:
        e = pending[0]
        parts.append(f"it is blocked in {numbered(e.op, e.seq if not e.is_p2p else e.p2p_seq)} on group '{e.group}'"
                     + (f" ({note})" if note else ""))
    elif not crash:
        parts.append("it is in no collective" + (f" ({note})" if note else ""))
    gone = left_alive(trace)
    if gone and not pending:
        parts.append(gone)
    now = where_now(trace)
    if now and not crash:
        parts.append(f"its {'streams are' if trace.source == 'simulated' else 'main thread is'} now at {now}")
    return f"rank {rank}: " + "; ".join(parts)


def is_gloo_fr(trace: RankTrace | None) -> bool:
    return bool(trace and trace.source.startswith("flight_recorder")
                and any(op.startswith("gloo:") for op in trace.column("raw_op")[-50:]))


def shows_no_p2p(trace: RankTrace | None) -> bool:
    """A dump that cannot show a send or recv: Gloo's Flight Recorder (no NCCL version) records none. Such a rank
    in no call may be blocked in p2p all the same: absence of evidence, not evidence that it never posted one."""
    return bool(trace and trace.source.startswith("flight_recorder") and not trace.comm_lib_version
                and not any(e.is_p2p for e in trace.entries[-256:]))


def in_no_call(trace: RankTrace | None) -> bool:
    """The recorder's dump of a rank in no call at all (`outside_torch`: not even one issued from C++), and not at
    its end (an exit, whether it left or finished): nothing shows it waits for anyone."""
    return outside_torch(trace) and not str(trace.dump_reason or "").startswith("exit:")


def stopped_through_hang(trace: RankTrace | None) -> str | None:
    """A phrase when the rank's own hang watchdog, in a suspected or confirmed hang, saw it in no call for at least
    the hang's threshold, and no call from C++ can hide behind that (`outside_torch`): it stopped outside any
    call while its peers waited, so it waits for nobody. A rank a launcher's signal caught between two calls was
    in none for a moment only, and is not this."""
    hang = trace.hang if trace is not None and isinstance(trace.hang, dict) else {}
    mine = hang.get("this_rank")
    if hang.get("status") not in ("suspected", "confirmed") or not isinstance(mine, dict) or \
            mine.get("blocked_in") is not None:
        return None
    idle, need = mine.get("idle_for_s"), hang.get("threshold_s") or hang.get("hang_timeout_s")
    if not isinstance(idle, (int, float)) or not isinstance(need, (int, float)) or idle < need or \
            not outside_torch(trace):
        return None
    return f"its own watchdog saw it in no call for {idle:.0f} s of the hang"


def left_alive(trace: RankTrace | None) -> str | None:
    """A phrase when the recorder's dump says the process exited with its process group alive (its exit hook
    dumped, no destroy_process_group): a rank that left the job on its own, mid-way when peers still wait."""
    reason = (trace.dump_reason or "") if trace is not None else ""
    if not reason.startswith("exit:") or "destroy" in reason:
        return None
    return f"it exited with its process group alive (its dump: '{reason}', no destroy_process_group)"
