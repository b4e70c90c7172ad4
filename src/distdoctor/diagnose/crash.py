"""Ranks that died of an exception, from the recorder's dump: its `exception` header (type, message, thread,
where, exit code; an exception that ended only a side thread is no crash: the process went on), else its
`dump_reason` "exception: Type: message", and the traceback dumped as the stack 'exception in <thread>'.

A crash that happened while the rank waited for others inside a collective or p2p (the call raised: a peer
closed the connection, the collective timed out), or whose exception is a communication failure at all, is
where the wave of waiting reached it, not where it began: that rank is explained by what it waited for
(diagnose/explain.py, which still reports it as `crashed` if nothing else does). Every other crash is a finding
of its own; ranks that crashed alike (same exception type and message) share one.

A rank stopped from outside (KeyboardInterrupt: a Ctrl-C to the job, typically once it hung) did not fail of its
own either: the stop is what ended it, not what went wrong; the finding that explains the job's state accounts
for it (explain.py), and it is reported as crashed only when nothing else is found.
"""

from __future__ import annotations

from distdoctor.findings.kinds import Finding, fmt_ranks
from distdoctor.diagnose.object_parts import skipped_part
from distdoctor.diagnose.progress import crash_of, crash_phrase, last_completed
from distdoctor.trace.model import TraceSet
from distdoctor.world.failures import COMM_FAILURE, raised_unpacking  # a backend's failures; an object's bytes


def crashed_ranks(ts: TraceSet) -> dict[int, dict]:
    """rank -> crash_of(trace), for every rank whose dump says it died of an exception (and the one the launcher's
    log shows went first, its traceback lost: unshown_first)."""
    out = {}
    for rank, trace in ts.ranks.items():
        if trace.exception or (trace.dump_reason and trace.dump_reason.startswith("exception")):  # cheap test
            crash = crash_of(trace)
            if crash:
                out[rank] = crash
    return out | unshown_first(ts)


STOPS = ("KeyboardInterrupt",)  # exceptions a stop from outside raises in a rank (Ctrl-C)


def stopped(crash: dict) -> bool:
    """The rank was stopped from outside (Ctrl-C), not failed."""
    return str(crash.get("type") or "").rsplit(".", 1)[-1] in STOPS


def comm_failed(crash: dict) -> bool:
    """The rank died of communicating: its exception's text says so (world/failures.py), or it was raised
    unpickling what an object collective delivered (`unpacking`: a peer sent other bytes)."""
    return bool(COMM_FAILURE.search(crash["text"]) or crash.get("unpacking"))


def on_its_own(rank: int, crash: dict, waiting: set[int]) -> bool:
    """A crash that is no echo of other ranks' trouble: not raised inside a call that waited for other ranks,
    not a communication failure, not a stop from outside."""
    return not ((rank in waiting and crash.get("in_call") is not None) or comm_failed(crash) or stopped(crash))


def crash_findings(ts: TraceSet, crashes: dict[int, dict], waiting: set[int], echoes: bool = False) -> list[Finding]:
    """One finding per distinct exception among the ranks that crashed on their own (`echoes`: all of them)."""
    alike: dict[str, list[int]] = {}
    for rank, crash in sorted(crashes.items()):
        if not echoes and not on_its_own(rank, crash, waiting):
            continue  # it failed because of others: a consequence of what it waited for
        alike.setdefault(crash["text"], []).append(rank)
    out = []
    for ranks in alike.values():
        first = ranks[0]
        trace, crash = ts.ranks[first], crashes[first]
        e = crash.get("in_call") or last_completed(trace)
        group, seq, op = (e.group, e.seq if not e.is_p2p else e.p2p_seq, e.op) if e is not None else (None, None, None)
        who = fmt_ranks(ranks)
        detail = f"{who} {crash_phrase(crash)}."
        if crash.get("in_call") is None and e is not None:
            whose = "Its" if len(ranks) == 1 else f"Rank {first}'s"
            detail += f" {whose} last completed call was {op} #{seq} on group '{group}'."
        out.append(Finding("crashed", ranks, group=group, seq=seq, op=op, t=trace.dump_time, detail=detail,
                           evidence={"exception": _exceptions(crashes, ranks),
                                     **({"raised_at": {"group": group, "seq": seq, "op": op,
                                                       "inside": crash.get("in_call") is not None}}
                                        if group is not None else {})}))
    return out


def _exceptions(crashes: dict[int, dict], ranks: list[int]) -> dict:
    """The ranks' exceptions as a finding's evidence (the call entry they were raised in left out)."""
    return {str(r): {k: v for k, v in crashes[r].items() if k != "in_call"} for r in ranks}


def unpacked_findings(ts: TraceSet, crashes: dict[int, dict]) -> list[Finding]:
    """The ranks that died turning what an object collective delivered into objects (`unpacking`): the bytes were
    no object's sizes or pickle, so a member that sent them took another root or size than they did (Gloo checks neither, and
    Gloo's Flight Recorder records no roots) - or the rank itself skipped a part of the object collective and took
    the next part's bytes for it. One hedged finding per call: the dead ranks are its `ranks`, every member of the
    call its `evidence.suspects` ("one of ..."), none of them decided here: a mismatch the dumps show names the
    culprit before it. A rank that died of a part it never issued, after parts every member completed alike,
    skipped it: named alone (object_parts.py). A p2p call's bytes (recv_object_list: a pipeline's shapes) came
    from its peer: the two; a rank whose dumps hold no call at all (Gloo's Flight Recorder of a pipeline, the
    launcher's log giving the exception) may have taken them from any rank: every rank."""
    at: dict[tuple, list[int]] = {}
    out = []
    for rank, crash in sorted(crashes.items()):
        e = crash.get("in_call") or last_completed(ts.ranks[rank])
        groups = [e.group] if e is not None else sorted(ts.ranks[rank].groups)  # none issued: any of its groups
        part = next((p for g in groups if crash.get("in_call") is None and (e is None or not e.is_p2p)
                     for p in [skipped_part(ts, rank, crash.get("at"), g)] if p is not None), None)
        if part is not None:
            out.append(_skipper(ts, rank, crash, part, crashes))
        else:
            at.setdefault(_unpacked_from(e), []).append(rank)
    for (group, seq, op, peer), ranks in at.items():
        suspects = sorted(set(_senders(ts, ranks[0], group, peer)) | set(ranks))  # a skipper dies so too
        text = crashes[ranks[0]]["text"]
        what = f"{op} #{seq} on group '{group}'" if group is not None else "an object collective (no call of it in " \
            "these dumps)"
        detail = (f"one of {fmt_ranks(suspects)}: {fmt_ranks(ranks)} died turning what {what} "
                  f"delivered into objects ({_clipped(text)}, raised "
                  f"in torch.distributed's object collective): those were no object's sizes or pickle, so a member "
                  f"that sent them took another root or size for that call (Gloo checks neither, and its Flight "
                  f"Recorder records no root), or a rank that skipped a part of the object collective took the next "
                  f"part's bytes for it. These dumps do not say which member.")
        out.append(Finding("crashed", ranks, group=group, seq=seq, op=op, t=ts.ranks[ranks[0]].dump_time,
                           detail=detail, evidence={"undecided": True, "suspects": suspects, "unpacking": True,
                                                    **({"peer": peer} if peer is not None else {}),
                                                    "exception": _exceptions(crashes, ranks)}))
    return out


def _unpacked_from(e) -> tuple:
    """(group, number, op, peer) of the call whose bytes a rank unpacked: a p2p call's bytes come from its peer;
    all None where no call shows (then from any rank)."""
    if e is None:
        return None, None, None, None
    return (e.group, e.p2p_seq, e.op, e.peer) if e.is_p2p else (e.group, e.seq, e.op, None)


def _clipped(text: str, width: int = 120) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _senders(ts: TraceSet, rank: int, group: str | None, peer: int | None):
    """The ranks whose bytes the dead rank may have unpacked: a p2p call's peer; a collective's members; with no
    call to show, every rank."""
    if peer is not None:
        return [peer]
    info = ts.ranks[rank].groups.get(group) if group is not None else None
    if info is not None:
        return info.ranks
    return range(ts.world_size) if group is None and ts.world_size else ts.ranks


def _skipper(ts: TraceSet, rank: int, crash: dict, part, crashes: dict[int, dict]) -> Finding:
    """The rank that skipped a part of an object collective and died reading the buffer it never filled
    (object_parts.py)."""
    text = crash["text"]
    detail = (f"rank {rank} never issued {part.op} #{part.seq} on group '{part.group}', the part of the object "
              f"collective every other member issued next from the line it died at ({crash.get('at')}), and died "
              f"turning a buffer that part never filled into objects ({_clipped(text)}"
              f"); every member completed the parts before it alike: rank {rank} skipped that part.")
    return Finding("crashed", [rank], group=part.group, seq=part.seq, op=part.op, t=ts.ranks[rank].dump_time,
                   detail=detail, evidence={"unpacking": True, "skipped_part": True,
                                            "exception": _exceptions(crashes, [rank])})


SIGNAL_PREFIX = "signal: "  # the recorder's dump_reason when a signal (SIGTERM, SIGINT) ended the rank


def ended_by_signal(trace) -> bool:
    """The rank's dump says a signal ended it (`signal: SIGTERM`)."""
    return (trace.dump_reason or "").startswith(SIGNAL_PREFIX)


def signal_of_its_own(trace) -> bool:
    """A signal ended the rank (ended_by_signal), the launcher's log does not say the launcher sent it, and its own
    watchdog had not confirmed a hang before it: a launcher stops the ranks still running once one failed, and
    `run --kill-on-hang` (or a user's Ctrl-C) stops a hung job, so those signals are consequences, never causes."""
    hang = trace.hang if isinstance(trace.hang, dict) else {}
    return ended_by_signal(trace) and (trace.launch or {}).get("ended") != "stopped" and \
        hang.get("status") != "confirmed"


def killed_first(ts: TraceSet, comm: dict[int, dict]) -> Finding | None:
    """The rank a signal ended (its dump says `signal: SIGTERM`) before every rank of `comm` (crashed of a
    communication failure, nothing else explaining them) dumped: the peer their connections lost, and so the
    culprit. Only when it alone was ended that early: a launcher stopping every rank at once is a consequence."""
    first_crash = min((ts.ranks[r].dump_time or float("inf")) for r in comm)
    early = sorted((t.dump_time, r) for r, t in ts.ranks.items() if r not in comm and t.dump_time
                   and signal_of_its_own(t) and t.dump_time < first_crash)
    if not early:  # no dump tells the time (Flight Recorder's): the launcher's log may tell the order
        early = [(None, r) for r in ended_on_their_own(ts) if r not in comm and r in ts.ranks
                 and ended_by_signal(ts.ranks[r])]
    if len(early) != 1:
        return None
    when, rank = early[0]
    sig = ts.ranks[rank].dump_reason[len(SIGNAL_PREFIX):]
    e = last_completed(ts.ranks[rank])
    where = f" Its last completed call was {e.op} #{e.seq if not e.is_p2p else e.p2p_seq} on group '{e.group}'." \
        if e is not None else ""
    first = comm[min(comm, key=lambda r: ts.ranks[r].dump_time or 0)]
    before = (f"its dump says so), {first_crash - when:.1f} s before" if when is not None else
              "the launcher's log says so: a signal the launcher did not send, before it stopped the others), and")
    return Finding("crashed", [rank], group=e.group if e else None, seq=(e.seq if not e.is_p2p else e.p2p_seq)
                   if e else None, op=e.op if e else None, t=when,
                   detail=(f"rank {rank} was ended by {sig} ({before} {fmt_ranks(comm)} failed talking to it "
                           f"({first['text'][:120]}).{where}"),
                   evidence={"signal": sig, "then_failed": sorted(comm)})


def launch_phrase(trace) -> str:
    """How the launcher's log says the rank ended: 'SIGTERM, which the launcher did not send', 'exit code 3',
    'RuntimeError: ...'."""
    launch = trace.launch or {}
    if launch.get("ended") == "unshown":
        return "exit code 1, its traceback not in the log"
    if launch.get("ended") == "exception":
        return str(launch.get("exception"))[:160]
    if launch.get("ended") == "signal":
        return f"{launch.get('signal')}, which the launcher did not send"
    return f"exit code {launch.get('exitcode')}"


# A process that aborted itself: a backend's answer to a peer more often than not (Gloo's enforce failure on a
# message of the wrong size - a collective mismatch another rank caused -, NCCL's watchdog on a timeout), a
# failed assertion of its own code otherwise. The launcher's log cannot tell which: never a cause of its own.
ABORTS = ("SIGABRT",)


def ended_on_their_own(ts: TraceSet) -> list[int]:
    """Ranks the launcher's log (trace/loaders/launcher_log.py) says ended before it stopped the others, of a
    cause of their own: a signal it did not send (but an abort: ABORTS), an exit code, an exception that is no
    communication failure nor a stop from outside, or an exit code 1 whose traceback the log does not hold
    (`unshown`: its cause may be either; the callers name a rank only when it is the one such rank). Empty
    without such a log, or when the job was stopped from outside (the launcher stopped every rank). Read once
    per account (the analysis asks for every rank absent from a call)."""
    if ts.launch is None:
        return []
    if "own" not in ts.launch.judged:
        ts.launch.judged["own"] = [rank for rank, ended in ts.launch.ranks.items() if _went_of_its_own(ended)]
    return ts.launch.judged["own"]


def _went_of_its_own(ended) -> bool:
    how, text = ended.ended, ended.exception or ""
    if how == "signal":
        return ended.signal not in ABORTS
    return how in ("exit", "unshown") or (how == "exception" and not COMM_FAILURE.search(text)
                                          and not (ended.frames and raised_unpacking(str(ended.frames[-1]), text))
                                          and text.split(":", 1)[0].rsplit(".", 1)[-1] not in STOPS)


def unshown_first(ts: TraceSet) -> dict[int, dict]:
    """The crashes of the ranks that went before the launcher stopped the others when the log holds no traceback
    of them (exit code 1) and no rank went of a cause the log shows: they failed first, of what the log lost (one
    finding names them all: which went first, nothing says)."""
    own = ended_on_their_own(ts)
    if not own or not all(r in ts.ranks and ts.launch.ranks[r].ended == "unshown" for r in own):
        return {}
    text = "exit code 1 before the launcher stopped the others; the launcher's log holds no traceback of it"
    return {r: {"type": "exited first", "message": text, "text": f"exited first: {text}", "exit_code": 1}
            for r in own}


def killed_absent(ts: TraceSet, absent: list[int], present: list[int], crashes: dict[int, dict]) -> Finding | None:
    """The one rank absent from a call that a signal ended before the members in the call failed talking to it
    (killed_first, over those members' communication failures): the crash it is, told as such whatever form of
    dump shows the others in the call (in it, or past it where Gloo retired the failed call)."""
    comm = {r: crashes[r] for r in present if r in crashes and COMM_FAILURE.search(crashes[r]["text"])}
    killed = killed_first(ts, comm) if len(absent) == 1 and comm else None
    return killed if killed is not None and killed.ranks == absent else None


SAME_MOMENT_S = 0.05  # two ends closer than this are one moment (a launcher's signal to every rank at once)


def signalled(ts: TraceSet) -> Finding | None:
    """When nothing else is found: the rank a signal ended first (its dump says `signal: SIGTERM`). A job with a
    rank ended from outside is not OK, whatever the rest of the traces show (the others may have finished, or
    left dumps that cannot show where they stood). Ranks ended at one moment are "one of" them."""
    ended = sorted((t.dump_time if t.dump_time is not None else float("inf"), r) for r, t in ts.ranks.items()
                   if signal_of_its_own(t))
    if not ended:
        return None
    first = ended[0][0]
    ranks = sorted(r for when, r in ended if when - first <= SAME_MOMENT_S or when == first)
    sigs = sorted({ts.ranks[r].dump_reason[len(SIGNAL_PREFIX):] for r in ranks})
    e = last_completed(ts.ranks[ranks[0]])
    where = (f" Its last completed call was {e.op} #{e.seq if not e.is_p2p else e.p2p_seq} on group '{e.group}'."
             if e is not None and len(ranks) == 1 else "")
    who = fmt_ranks(ranks) if len(ranks) == 1 else f"one of {fmt_ranks(ranks)}: {fmt_ranks(ranks)}"
    others = len(ended) - len(ranks)
    return Finding("crashed", ranks, group=e.group if e else None, seq=(e.seq if not e.is_p2p else e.p2p_seq)
                   if e else None, op=e.op if e else None, t=None if first == float("inf") else first,
                   detail=(f"{who} {'was' if len(ranks) == 1 else 'were'} ended by {', '.join(sigs)} (the dump "
                           f"says so){f', the first of {len(ended)} ranks a signal ended' if others else ''}; "
                           f"nothing in the traces shows another cause.{where}"),
                   evidence={"signal": sigs, "ended": [r for _, r in ended]})
