"""false_wait: a collective queued on a device stream behind a collective of another group.

Where several groups' collectives share one stream (FSDP's single unshard stream, pytorch/pytorch#116611), a
collective cannot start before the one enqueued ahead of it finishes, even when it belongs to another group and
its own peers are ready; compute that waits on it (`wait_stream`) then waits for the other group's collective
too. The evidence, on a device stream: an entry of group B that started the moment the previous entry, of group
A, finished (back to back: the stream was busy with A), for as long as A ran since B was enqueued (since A
started, when the trace's issue time is when the stream reached B, as the simulator's is). When B's issue time
is its enqueue time and came earlier, the measured wait is B's start minus its issue.

That needs traces that carry device streams with start and end times: the simulator's `--emit-trace` output
(source "simulated", one stream per simulated stream). NCCL_DEBUG logs name a `stream 0x..` but carry no times;
the recorder's `stream` is the Python thread that made the call, and Gloo's Flight Recorder records no stream:
from them this hazard is never reported (nothing is guessed). Per-stream state for real traces is planned in
the trace model; device_streams() is the one place to accept it.
"""

from __future__ import annotations

from distdoctor.findings.kinds import fmt_ranks
from distdoctor.lint.hazard import Hazard, call, site_of
from distdoctor.trace.model import RankTrace, TraceSet

SLACK_S = 1e-9  # simulated times are exact; real ones would need the clock's granularity


def device_streams(trace: RankTrace) -> bool:
    """Whether the trace's `stream` fields name device streams (not Python threads)."""
    return trace.source == "simulated"


def _queued(prev, e) -> float | None:
    """Seconds `e` spent behind `prev` (another group's collective just ahead on its stream), or None."""
    if None in (e.t_started, prev.t_started, prev.t_completed):
        return None
    if abs(e.t_started - prev.t_completed) > SLACK_S:
        return None  # not back to back: the stream was idle, or e waited for its own peers
    if e.t_created is not None and e.t_created < prev.t_completed - SLACK_S:
        since = max(prev.t_started, e.t_created)  # enqueued while prev ran: measured
    else:
        since = prev.t_started  # issued when the stream reached it: at most prev's whole run (an upper bound)
    waited = e.t_started - since
    return waited if waited > SLACK_S else None


def find(ts: TraceSet) -> list[Hazard]:
    found: dict[tuple, dict] = {}  # (stream, blocked group, blocking group) -> ranks, count, waited, example
    for r, trace in sorted(ts.ranks.items()):
        if not device_streams(trace):
            continue
        last: dict[str, object] = {}
        for e in trace.entries:
            if e.stream is None or e.is_p2p or e.seq is None:
                continue
            prev = last.get(e.stream)
            last[e.stream] = e
            if prev is None or prev.group == e.group:
                continue
            waited = _queued(prev, e)
            if waited is None:
                continue
            key = (e.stream, *sorted((e.group, prev.group)))
            got = found.setdefault(key, {"ranks": set(), "count": 0, "waited": 0.0, "example": (r, e, prev)})
            got["ranks"].add(r)
            got["count"] += 1
            got["waited"] += waited
    hazards = []
    for (stream, g1, g2), got in sorted(found.items(), key=lambda kv: (-kv[1]["waited"], kv[0])):
        r, e, prev = got["example"]
        ranks = sorted(got["ranks"])
        h = Hazard("false_wait", ranks, [g1, g2], "")
        h.detail = (f"on {fmt_ranks(ranks)}, collectives of groups '{g1}' and '{g2}' share stream '{stream}': "
                    f"{got['count']} time(s) one queued behind the other group's, {got['waited'] * 1e3:.3f} ms in "
                    f"all (e.g. rank {r}'s {call(e)} on '{e.group}' behind {call(prev)} on '{prev.group}'); whatever "
                    f"waits for one (compute, through wait_stream) waits for the other group too. Give each group "
                    f"its own stream.")
        h.add_site([r], f"issued {call(e)} on group '{e.group}' from", site_of(e))
        h.add_site([r], f"behind {call(prev)} on group '{prev.group}' from", site_of(prev))
        h.evidence = {"stream": stream, "count": got["count"], "queued_s": got["waited"]}
        hazards.append(h)
    return hazards
