"""Was the job hung when the ranks dumped, and how sure is the recorder? The `hang` object of `diagnose`.

The recorder's watchdog (recorder/hangwatch.py) writes the hang episode a dump belongs to into the dump's header:
`suspected` (a call in flight past the adaptive threshold max(floor, factor x the longest recent collective
wait)), `confirmed` (no progress for the hang timeout) or `resumed` (progress came back; the dump keeps the
picture from the moment the hang was suspected), with the threshold and how it was derived, and this rank's own
state: the call it was blocked in and for how long, or none. This module merges the headers of all ranks:

- status: `resumed` when a rank's resume came after every rank's detection; else `confirmed` if any rank
  confirmed; else `suspected`.
- blocked_for_s: the longest any rank had been blocked when it dumped (for `resumed`: how long until progress).
- threshold_s and threshold (floor_s, factor, recent_wait_s, waits_seen, derived) from the first detection.
- blocked_ranks (in a call, with where), idle_ranks (in no call: often the culprit), not_dumped (ranks with a
  trace but no dump for this hang).

Traces without hang headers (Flight Recorder dumps, older recorder dumps, dumps made on request) give None.

The header is also evidence for the analysis (`header_waits`): a rank whose dump says its watchdog saw it
blocked (a suspected or confirmed hang, `this_rank.blocked_in`) in a call only Flight Recorder saw (issued
from C++: DDP's gradient buckets), while this rank's Flight Recorder dump is not among the traces, was blocked
in a call its trace cannot hold. It is blocked in it all the same: the analysis gets a pending entry for it
(`raw_op` "watchdog:<op>") and, for a collective, a wait for every member of the group that did not reach it
(members whose own header shows them in that call or in a later collective of the group, or whose Flight
Recorder dump holds it, reached it). So the
verdict is never `ok` beside a hang the recorder saw, and the members that never came are where the wait-for
graph ends (explain.py names them). Where the trace can hold the call (the recorder's own calls, a rank whose
Flight Recorder dump was given), the trace's state is the evidence, header or not.
"""

from __future__ import annotations

import time

from typing import TYPE_CHECKING

from distdoctor.findings.kinds import fmt_ranks
from distdoctor.diagnose.progress import header_call, watched_past, where_now
from distdoctor.trace.model import LIVE_REASON, Entry, TraceSet

if TYPE_CHECKING:
    from distdoctor.diagnose.match import GroupView
    from distdoctor.diagnose.waitfor import Wait

WATCHDOG = "watchdog:"  # raw_op prefix of the pending entries made from hang headers

ORDER = {"resumed": 0, "suspected": 1, "confirmed": 2}


def summarize(ts: TraceSet) -> dict | None:
    headers = {r: t.hang for r, t in sorted(ts.ranks.items())
               if isinstance(t.hang, dict) and t.hang.get("status") in ORDER}
    if not headers:
        return None
    detections = [h.get("detected_at") or 0.0 for h in headers.values()]
    resumes = [h for h in headers.values() if h["status"] == "resumed"]
    last_resume = max((h.get("resumed_at") or 0.0 for h in resumes), default=None)
    if last_resume is not None and last_resume >= max(detections):
        status = "resumed"
    elif any(h["status"] == "confirmed" for h in headers.values()):
        status = "confirmed"
    else:
        status = "suspected"
    first = min(headers.values(), key=lambda h: (h.get("requested", False), h.get("detected_at") or 0.0))
    mine = {r: h.get("this_rank") or {} for r, h in headers.items()}
    blocked = {r: m for r, m in mine.items() if m.get("blocked_in")}
    out = {
        "status": status,
        "blocked_for_s": max((m.get("blocked_for_s") or 0.0 for m in blocked.values()), default=None),
        "threshold_s": first.get("threshold_s"),
        "threshold": _threshold(first),
        "hang_timeout_s": first.get("hang_timeout_s"),
        "detected_by": first.get("detected_by"),
        "detected_at": first.get("detected_at"),
        "since": first.get("since"),
        "blocked_ranks": sorted(blocked),
        "idle_ranks": sorted(r for r in mine if r not in blocked),
        "not_dumped": sorted(r for r in ts.ranks if r not in headers),
        # traces read live from the ranks (diagnose/live.py), not dumps: a rank without a header saw no hang itself
        "live": bool(ts.ranks) and all(t.dump_reason == LIVE_REASON for t in ts.ranks.values()),
        "blocked_in": {str(r): m["blocked_in"] for r, m in blocked.items()},
        "now": {str(r): w for r in mine if r not in blocked and (w := where_now(ts.ranks[r]))},
    }
    if status == "resumed":
        out["resumed_after_s"] = max(h.get("resumed_after_s") or 0.0 for h in resumes)
    return out


def _threshold(h: dict) -> dict | None:
    if h.get("threshold_s") is None:
        return None
    floor, factor, wait = h.get("floor_s"), h.get("factor"), h.get("recent_wait_s")
    return {"floor_s": floor, "factor": factor, "recent_wait_s": wait, "waits_seen": h.get("waits_seen"),
            "derived": f"max(floor {floor:g} s, {factor:g} x longest recent collective wait {wait:.2f} s)"}


def describe(hang: dict) -> str:
    """One line for the text reports."""
    when = time.strftime("%H:%M:%S", time.localtime(hang["detected_at"])) if hang.get("detected_at") else "?"
    by = f"detected by rank {hang['detected_by']} at {when}"
    parts = []
    if hang["status"] == "resumed":
        parts.append(f"resumed after {hang.get('resumed_after_s', 0):.1f} s (the job made progress again; "
                     f"the dumps show the moment it was suspected, {by})")
    else:
        if hang["blocked_ranks"]:
            parts.append(f"{hang['status']}: " + _blocked(hang))
        else:
            parts.append(f"{hang['status']}: no rank was in a collective when it dumped")
        if hang["idle_ranks"]:
            now = "; ".join(f"rank {r} now at {w}" for r, w in list(hang["now"].items())[:3])
            parts.append(f"{fmt_ranks(hang['idle_ranks'])} in no collective" + (f" ({now})" if now else ""))
        if hang["not_dumped"]:
            parts.append(f"{fmt_ranks(hang['not_dumped'])} " + ("saw no hang themselves" if hang.get("live")
                                                                  else "did not dump for it"))
        parts.append(by)
    if hang["status"] == "confirmed":
        parts.append(f"no progress for the hang timeout ({hang.get('hang_timeout_s') or 0:g} s)")
    elif hang.get("threshold"):
        parts.append(f"threshold {hang['threshold_s']:g} s = {hang['threshold']['derived']}")
    return "; ".join(parts)


def text_lines(report) -> list[str]:
    """The report's hang line, for report/diagnose_text.py (none when no dump carries a hang episode)."""
    hang = summarize(report.traces)
    return [f"hang: {describe(hang)}"] if hang else []


def _blocked(hang: dict) -> str:
    """Who is blocked where, the largest crowd first: a rank blocked elsewhere than the others stands out."""
    by_call: dict[str, list[int]] = {}
    for r, c in hang["blocked_in"].items():
        by_call.setdefault(_call(c), []).append(int(r))
    where = sorted(by_call.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    longest = f"{hang['blocked_for_s']:.1f} s"
    if len(where) == 1:
        return f"{fmt_ranks(where[0][1])} blocked up to {longest} in {where[0][0]}"
    more = f" and {len(where) - 4} more places" if len(where) > 4 else ""
    return f"blocked up to {longest}: " + ", ".join(f"{fmt_ranks(rs)} in {call}" for call, rs in where[:4]) + more


def _call(c: dict) -> str:
    group = "the default group '0'" if c.get("group") == "0" else f"group '{c.get('group')}'"
    src = " (Flight Recorder)" if c.get("source") == "flight_recorder" else ""
    return f"{c.get('op')} #{c.get('seq')} on {group}{src}"


def _holds(trace, call: dict) -> Entry | None:
    """A Flight Recorder trace's entry for a call Flight Recorder numbered (a recorder-only trace numbers Python
    calls only: its #n is another call)."""
    if "flight_recorder" not in trace.source:
        return None
    p2p = call["op"] in ("send", "recv")
    for e in trace.entries[-256:]:
        if e.group == call["group"] and e.op == call["op"] and (e.p2p_seq if p2p else e.seq) == call["seq"]:
            return e
    return None


def _reached(theirs: dict, call: dict) -> bool:
    """A member whose own header shows it in this call, or in a later collective of the group by the same
    numbering (Flight Recorder's), reached it: the root of a broadcast, say, finished its part and went on. (A
    recorder trace's own entries number the Python calls only: they are not compared with these.)"""
    if theirs["group"] != call["group"] or theirs.get("source") != call.get("source"):
        return False
    return theirs["op"] not in ("send", "recv") and watched_past(theirs["seq"], theirs["op"], call["seq"], call["op"])


def header_waits(ts: TraceSet, views: dict[str, GroupView], pending: dict[int, list[Entry]]) -> list[Wait]:
    """Pending entries (added to `pending`) and waits for ranks the hang headers show blocked in a call their
    traces do not hold (see the module's docstring)."""
    from distdoctor.diagnose.waitfor import Wait

    blocked: dict[int, tuple[dict, Entry]] = {}
    for r, trace in ts.ranks.items():
        call = header_call(trace)
        if call is None or call.get("source") != "flight_recorder" or "flight_recorder" in trace.source or \
                pending.get(r):
            continue
        e = Entry(index=-1, group=call["group"], op=call["op"], raw_op=WATCHDOG + call["op"], state="started",
                  t_created=call.get("since"), stream="MainThread")
        if e.is_p2p:
            e.p2p_seq = call["seq"]
        else:
            e.seq = call["seq"]
        blocked[r] = (call, e)
        pending[r] = [e]
    waits: list[Wait] = []
    for r, (call, e) in blocked.items():
        view = views.get(call["group"])
        if e.is_p2p or view is None:
            continue
        blockers = []
        for m in view.members:
            if m == r:
                continue
            theirs = blocked.get(m)
            if theirs is not None and _reached(theirs[0], call):
                continue
            trace = ts.ranks.get(m)
            if trace is not None and _holds(trace, call) is not None:
                continue
            blockers.append(m)
        if blockers:
            waits.append(Wait(r, e, blockers))
    return waits
