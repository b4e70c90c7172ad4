"""Ranks ended on their way: absent from a call the others issued, but only because the job was ended around them.

A launcher ends every rank once one of them dies (torchrun's SIGTERM), a scheduler preempts the job, a user
presses Ctrl-C. A rank that was between two calls at that moment never issued the call its peers were already
in, and reads as absent from it, like a rank that stopped. The difference is time: a rank that stopped leaves
the others waiting (seconds, up to a hang timeout) before anything ends the job; a rank on its way was ended
about as soon as its peers went from the last call they shared to this one.

So a rank is *on its way* when its dump says a stop from outside ended it (the recorder's `signal: SIGTERM`,
or a KeyboardInterrupt), no rank's watchdog had called the job hung, and the time from its completing the last
call it shared with the others to its end is no more than twice (PACE_FACTOR, plus SLACK_S) what the others
took over the same stretch of the program: from their completing that call to their issuing the one they wait
in. A rank that skipped the call and went on (into the next step's backward, say) is away longer than that
before the launcher ends it; one merely behind on a loaded host is not. The margin is measured, not wide: in
the campaign's real runs a rank behind was away 1.3 times its peers' stretch (FSDP, `gloo-fsdp-sigsegv-behind`),
ranks that skipped 3.0 and 4.7 times (DDP, `gloo-ddp-skip-fast`, `gloo-ddp-skip`). Its
absence is then a consequence of whatever ended the job, never its cause. Flight Recorder's dumps carry no
end time: a rank that left only one cannot show this. Merged with the recorder's trace they can, but Gloo's
records no completion time, and the last call the ranks shared is often one only it saw (DDP issues its buckets
from C++): the last member's arrival, before which no member's blocking call completed, stands for the
completion of every member then (`_completions`; tests/fuzz/test_fuzz_ended_on_the_way.py).
"""

from __future__ import annotations

from distdoctor.diagnose.crash import ended_by_signal, ended_on_their_own, stopped
from distdoctor.trace.model import Entry, RankTrace, TraceSet
from distdoctor.world.failures import PEER_CLOSED

PACE_FACTOR = 2.0  # how many times its peers' stretch a rank merely behind may take (a loaded host)
SLACK_S = 0.05  # clock resolution and one scheduler tick


def ended_from_outside(trace: RankTrace, crash: dict | None) -> bool:
    return ended_by_signal(trace) or (crash is not None and stopped(crash))


def on_its_way(ts: TraceSet, view, rank: int, seq: int, present: list[int], crashes: dict[int, dict],
               hung: bool) -> float | None:
    """How long `rank` was away from its last call shared with `present` (which issued collective `seq` of
    `view`'s group) when it was ended, when it was ended on its way (see above; `hung`: some rank's watchdog
    called the job hung, computed once by the caller); STOPPED_AFTER when the launcher's log says it stopped the
    rank after ranks absent from the call too went first (no time is needed then); else None."""
    trace = ts.ranks.get(rank)
    if trace is not None and _stopped_after(ts, view, trace, present):
        return STOPPED_AFTER
    if hung or trace is None or trace.dump_time is None or not ended_from_outside(trace, crashes.get(rank)):
        return None
    mine = view.by_rank.get(rank) or {}
    shared = max((s for s in mine if s < seq), default=None)
    if shared is None:
        return None
    befores = [(view.by_rank.get(r) or {}).get(shared) for r in present]
    nows = [(view.by_rank.get(r) or {}).get(seq) for r in present]
    if any(e is None for e in befores + nows) or any(e.t_created is None for e in nows):
        return None
    done = _completions([mine[shared]] + befores)
    if done is None:
        return None
    stretch = [now.t_created - end for now, end in zip(nows, done[1:])]
    away = trace.dump_time - done[0]
    return away if stretch and away <= PACE_FACTOR * max(stretch) + SLACK_S else None


def _completions(calls: list[Entry]) -> list[float] | None:
    """When each rank's part of one shared collective completed: its own completion time where every rank's
    is known, else one time for all - the last member's arrival, before which no member's blocking call could
    complete (Gloo's Flight Recorder records no completion time, and the calls a job issues from C++, DDP's
    buckets, are in no other dump). None when not even the arrivals are known."""
    if all(e.t_completed is not None for e in calls):
        return [e.t_completed for e in calls]
    if any(e.t_created is None for e in calls):
        return None
    last = max(e.t_created for e in calls)
    return [last] * len(calls)


STOPPED_AFTER = -1.0  # on_its_way's answer for a rank the launcher stopped after another went (no time needed)


def _stopped_after(ts: TraceSet, view, trace: RankTrace, present: list[int]) -> bool:
    """The launcher's log says it stopped this rank (its own signal, once a worker had failed), and the ranks that
    went before, of a cause of their own, are members absent from this call too: the call lost them first, and
    this rank was stopped on its way. (A rank that went on its own while the others were in the call, or a job
    whose first failures were timeouts - a hang - proves nothing of the ranks the launcher stopped: a hung rank
    is stopped by it too.)"""
    if (trace.launch or {}).get("ended") != "stopped":
        return False
    first = ended_on_their_own(ts)
    return bool(first) and all(r in view.members and r not in present for r in first)


def way_because(on_way: dict[int, float]) -> str:
    """Why ranks on their way to a call are consequences (on_its_way's answers)."""
    timed = [away for away in on_way.values() if away != STOPPED_AFTER]
    said = []
    if timed:
        said.append(f"ended from outside on their way to it, {max(timed):.2f} s after their last call: about as "
                    "long as the others took to reach it (diagnose/ended.py)")
    if len(timed) < len(on_way):
        said.append("stopped by the launcher (its log) once a rank absent from it too had gone of a cause of its "
                    "own: on their way to it")
    return "; ".join(said)


def p2p_ends(ts: TraceSet, pending: dict[int, list[Entry]], crashes: dict[int, dict], hung: bool) -> tuple[dict, dict]:
    """What the ranks blocked in a send or recv say of their peers, read once per analysis: (peer -> (when a rank
    saw its connection close, that rank), peer -> (the latest a rank still blocked with it dumped, that rank)).
    A rank whose send/recv failed because the peer closed the connection saw the peer's process end; a rank
    still blocked saw it there (a Gloo pair notices a closed peer at once). Nothing when a watchdog called the
    job hung (`hung`): a peer a timeout ended closes its connections too."""
    closed: dict[int, tuple[float, int]] = {}
    alive: dict[int, tuple[float, int]] = {}
    for rank, entries in ({} if hung else pending).items():
        e, t = (entries[0] if entries else None), ts.ranks[rank].dump_time
        if e is None or not e.is_p2p or e.peer is None or t is None:
            continue
        crash = crashes.get(rank)
        if crash is not None and PEER_CLOSED.search(crash["text"]):  # (raised where it waited for the call)
            closed[e.peer] = min(closed.get(e.peer, (t, rank)), (t, rank))
        elif crash is None and e.error is None:
            alive[e.peer] = max(alive.get(e.peer, (t, rank)), (t, rank))
    return closed, alive


def first_to_close(ends: tuple[dict, dict], suspects: list[int]) -> tuple[int, int, int] | None:
    """Of `suspects` (peers whose dumps cannot show p2p: Gloo's Flight Recorder), the one whose process ended
    first while the others still ran (`ends`: p2p_ends): a rank saw it close, and every other suspect was later
    still connected to a rank blocked with it. Returns (suspect, the rank that saw it close, one that saw the
    others still there), else None."""
    closed, alive = ends
    gone = [q for q in suspects if q in closed]
    if len(gone) != 1:
        return None
    first, (when, saw) = gone[0], closed[gone[0]]
    others = [q for q in suspects if q != first]
    if not others or not all(q in alive and alive[q][0] > when for q in others):
        return None
    return first, saw, max(alive[q] for q in others)[1]
