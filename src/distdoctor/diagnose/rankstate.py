"""What happened to each rank, in one word and a phrase - the classes the best hang analyzers use.

- crashed: died of an exception (type, message and where, from the recorder's dump);
- gpu_stopped / cpu_stopped: (NCCL) named by that finding: its GPU stopped completing work / its CPU stopped
  issuing it;
- deadlocked: on a cycle of waits (order_deadlock, p2p_deadlock);
- mismatched: issued a call its peers disagree with (type, size, dtype, root): a culprit of a mismatch;
- waiting_on_idle / waiting_on_active / waiting_on_lost: blocked in a collective or p2p, waiting for ranks that
  are in no collective / are themselves blocked in other calls / left no trace or crashed;
- stuck_in_collective: blocked in a call that waits for nobody visible (every member issued it, or no other
  member is known);
- outside_collectives: in no collective while other ranks wait for it: stuck in Python (where: its stack);
- never_joined: recorded no collective at all while other ranks did;
- in_flight: (NCCL) its GPU runs calls every member reached - the CPU returned long ago, nothing waits;
- idle: in no collective, and nobody waits for it (finished, or between collectives);
- no_trace: left no trace (set by analyze).
The first that applies, in this order. `finding` is the index of the finding that explains the rank.
"""

from __future__ import annotations

from distdoctor.diagnose.explain import Explainer
from distdoctor.findings.kinds import Finding, fmt_group, fmt_ranks, numbered
from distdoctor.diagnose.progress import crash_phrase, where_now
from distdoctor.trace.model import TraceSet

RANK_STATES = ("crashed", "gpu_stopped", "cpu_stopped", "deadlocked", "mismatched", "waiting_on_idle", "waiting_on_active", "waiting_on_lost",
               "stuck_in_collective", "outside_collectives", "never_joined", "in_flight", "idle", "no_trace")
_MISMATCH = ("type_mismatch", "size_mismatch", "dtype_mismatch", "root_mismatch")


def rank_states(ts: TraceSet, ex: Explainer, findings: list[Finding], explained_by: dict[int, Finding],
                on_cycle: set[int], in_flight: dict[int, list] | None = None,
                behind: list | None = None) -> dict[int, dict]:
    """`in_flight`: rank -> its calls every member reached, running on the GPU (NCCL); `behind`: (wait, why) for
    waits that prove nothing under NCCL (nccl_frontier.unproven)."""
    index = {id(f): i for i, f in enumerate(findings)}
    named = ex.named(findings)
    mismatched = {r for f in findings if f.kind in _MISMATCH for r in f.ranks}
    waited_for: dict[int, set[int]] = {}
    for r, ws in ex.waits_of.items():
        for w in ws:
            for b in w.waits_for:
                waited_for.setdefault(b, set()).add(r)
    anyone_recorded = any(len(t.entries) for t in ts.ranks.values())
    stopped = {r: f for f in findings if f.kind in ("gpu_stopped", "cpu_stopped") for r in f.ranks}
    later = {}
    for w, why in behind or []:
        later.setdefault(w.rank, (w, why))
    out = {}
    for r, trace in ts.ranks.items():
        if r in stopped:
            f = stopped[r]
            state, phrase = f.kind, ("its GPU stopped completing work" if f.kind == "gpu_stopped" else
                                     "its CPU stopped issuing work") + f" (see finding {index[id(f)] + 1})"
        elif r in later and not ex.waits_of.get(r) and r not in on_cycle:
            w, why = later[r]
            idle = all(not ex.pending.get(b) and not ex.waits_of.get(b) for b in w.waits_for)
            state = "waiting_on_idle" if idle else "waiting_on_active"
            phrase = f"blocked in {_where(ex, w.entry)}, waiting for {fmt_ranks(w.waits_for)} ({why})"
        else:
            state, phrase = _classify(r, trace, ex, mismatched, on_cycle, waited_for, anyone_recorded,
                                      (in_flight or {}).get(r))
        got = {"state": state, "state_detail": phrase}
        f = explained_by.get(r) or named.get(r)
        if f is not None:
            got["finding"] = index[id(f)]
        out[r] = got
    return out


def _classify(r, trace, ex: Explainer, mismatched, on_cycle, waited_for, anyone_recorded,
              running=None) -> tuple[str, str]:
    if r in ex.crashes:
        return "crashed", crash_phrase(ex.crashes[r])
    pend = ex.pending.get(r) or []
    where = ""
    if pend:
        where = _where(ex, pend[0])
    if r in on_cycle:
        return "deadlocked", f"on a cycle of waits, blocked in {where}" if where else "on a cycle of waits"
    if r in mismatched:
        return "mismatched", f"issued a call its peers disagree with; blocked in {where}" if where else \
            "issued a call its peers disagree with"
    waits = ex.waits_of.get(r, [])
    if waits:
        blockers = sorted({b for w in waits for b in w.waits_for})
        lost = [b for b in blockers if b not in ex.ts.ranks or b in ex.crashes]
        idle = [b for b in blockers if b in ex.ts.ranks and b not in ex.crashes and not ex.waits_of.get(b)]
        state = "waiting_on_lost" if lost else "waiting_on_idle" if idle else "waiting_on_active"
        which = lost or idle or blockers
        kind = {"waiting_on_lost": "lost or crashed", "waiting_on_idle": "in no collective",
                "waiting_on_active": "blocked elsewhere"}[state]
        return state, f"blocked in {where}, waiting for {fmt_ranks(which)} ({kind})"
    if pend:
        return "stuck_in_collective", f"blocked in {where}; " + ex.alone_reason(r, pend[0])
    now = where_now(trace)
    at = f", at {now}" if now else ""
    if not len(trace.entries) and anyone_recorded:
        blind = " (Gloo's Flight Recorder records no send/recv)" if trace.source.startswith("flight_recorder") else ""
        return "never_joined", "recorded no collective while other ranks did" + blind + at
    if running:
        return "in_flight", (f"its GPU runs {_where(ex, running[0])}" + (f" and {len(running) - 1} more" if
                             len(running) > 1 else "") + ", every member reached: nothing waits")
    if r in waited_for:
        return "outside_collectives", f"in no collective{at}; {fmt_ranks(waited_for[r])} wait for it"
    return "idle", f"in no collective{at}"


def _where(ex: Explainer, e) -> str:
    seq = e.p2p_seq if e.is_p2p else e.seq
    desc = ex.views[e.group].desc if e.group in ex.views else ""
    return f"{numbered(e.op, seq)} on {fmt_group(e.group, desc)}"
