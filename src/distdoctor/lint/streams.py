"""false_wait: a collective queued on a device stream behind a collective of another group.

Where several groups' collectives share one stream (FSDP's single unshard stream, pytorch/pytorch#116611), a
collective cannot start before the one enqueued ahead of it finishes, even when it belongs to another group and
its own peers are ready; compute that waits on it (`wait_stream`) then waits for the other group's collective
too. The evidence is an entry whose stream is a device stream and whose start came when the previous entry on
that stream, of another group, finished, though it was issued earlier: it waited (start - issue) for a
collective it does not need.

That needs traces that carry device streams with issue and start times: the simulator's `--emit-trace` output
(source "simulated", one stream per simulated stream) and NCCL_DEBUG logs' `stream 0x..` (no times: never
enough alone). The recorder's `stream` is the Python thread that made the call, and Gloo's Flight Recorder
records no stream: from them this hazard is never reported (nothing is guessed).
"""

from __future__ import annotations

from distdoctor.diagnose.findings import fmt_ranks
from distdoctor.lint.hazard import Hazard, call, site_of
from distdoctor.trace.model import RankTrace, TraceSet

SLACK_S = 1e-9  # simulated times are exact; real ones would need the clock's granularity


def device_streams(trace: RankTrace) -> bool:
    """Whether the trace's `stream` fields name device streams (not Python threads)."""
    return trace.source == "simulated"


def find(ts: TraceSet) -> list[Hazard]:
    found: dict[tuple, dict] = {}  # (stream, blocked group, blocking group) -> ranks, count, waited, example
    for r, trace in sorted(ts.ranks.items()):
        if not device_streams(trace):
            continue
        last: dict[str, object] = {}
        for e in trace.entries:
            if e.stream is None or e.is_p2p:
                continue
            prev = last.get(e.stream)
            last[e.stream] = e
            if prev is None or prev.group == e.group:
                continue
            if None in (e.t_created, e.t_started, prev.t_completed):
                continue
            if e.t_created < prev.t_completed - SLACK_S and e.t_started >= prev.t_completed - SLACK_S:
                waited = e.t_started - e.t_created
                got = found.setdefault((e.stream, e.group, prev.group), {"ranks": set(), "count": 0, "waited": 0.0,
                                                                         "example": (r, e, prev)})
                got["ranks"].add(r)
                got["count"] += 1
                got["waited"] += waited
    hazards = []
    for (stream, group, other), got in sorted(found.items(), key=lambda kv: -kv[1]["waited"]):
        r, e, prev = got["example"]
        ranks = sorted(got["ranks"])
        h = Hazard("false_wait", ranks, sorted({group, other}), "")
        h.detail = (f"on {fmt_ranks(ranks)}, collectives of group '{group}' queue on stream '{stream}' behind "
                    f"collectives of group '{other}' ({got['count']} time(s), {got['waited'] * 1e3:.3f} ms in all; "
                    f"e.g. rank {r}'s {call(e)} waited for {call(prev)} of group '{other}'): whatever waits for them "
                    f"waits for the other group too. Give each group its own stream.")
        h.add_site([r], f"issued {call(e)} on group '{group}' from", site_of(e))
        h.add_site([r], f"behind {call(prev)} on group '{other}' from", site_of(prev))
        h.evidence = {"stream": stream, "count": got["count"], "waited_s": got["waited"]}
        hazards.append(h)
    return hazards
