"""Stragglers: no hang, but a rank arrives late at collectives, consistently — and the same answer every run.

Samples. Every collective that all members of its group issued (matched by group and seq, every group, gradient
buckets and small collectives alike) gives each member an arrival time: `t_created` (when the rank issued it),
else `t_started`. A rank's lateness at that collective is its arrival minus the median arrival of the OTHER
members: a rank that is late is late against the group's typical member, and ranks that are on time sit near 0
whatever one slow rank does.

Classes. Collectives are compared within a class: the same group, op and sizes, which recurs once (or a few
times) per training step. A straggler is late where it joins after its own slow phase (its first collective of
the step, a DDP gradient bucket) and on time at collectives that follow a synchronizing one; pooling both, as a
single mean or a single "last to arrive" count did, made the answer flip between runs of the same job.

Decision, per class with at least MIN_SAMPLES occurrences over at least MIN_STEPS steps (a rank late in the
only two steps of a short job may be a slow start, or a process the OS descheduled on a busy host): rank r is
late when its median lateness m is
  - at least MIN_LATE_S, and
  - at least MIN_STEP_SHARE of the step (when it is known: how often the class recurs, in collectives of its
    group, timed on the earliest arrivals), and
  - at least Z robust standard errors above zero, the noise being 1.4826 x the median absolute deviation of
    every member's lateness from its own median in that class (a slow rank's own scatter counts too).
A late rank held in a collective before is not late by its own work, and is left out (`_held_before`): at most
of its late calls another member arrived at one of its last few collectives after it and it came here soon after
that member (a gather's root waiting for a slow member leaves late, and arrives late at the next calls). Arrival
times are all this asks for: Flight Recorder's dumps over Gloo give no end times. Nor does a held lateness speak
for a role: the sibling groups' members judged by `_late_by_role` count with their own lateness only.
A rank is a straggler if it is late in any class; it is named with its largest median lateness, in ms and as
a share of the step, and with where it loses the time: walking back from an occurrence of that class over the
group's collectives while it is still late (at least half its median lateness), the last collective it was on
time at and the first it was late at bracket its slow phase (sites.py names their call sites). Medians and MADs
ignore a few hiccups (a GC pause, a descheduled process) that move a mean.

Assumption: the clocks of the ranks agree to well under MIN_LATE_S (one host, or NTP-synced hosts); a constant
offset between hosts reads as lateness.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict

import numpy as np

from distdoctor.findings.kinds import Finding, fmt_group, fmt_ranks
from distdoctor.diagnose.match import GroupView, SeqEntries
from distdoctor.diagnose.ties import sibling_groups
from distdoctor.world.lateness import MIN_LATE_S, judge_lateness, median_of_others

MIN_SAMPLES = 4
MIN_HELD = 2  # calls a late rank was seen held at before its lateness is called held (_held_before)
HELD_BACK = 3  # how many of a rank's collectives back a hold that made it late may lie (_held_before)
MIN_STEPS = 3  # a rank late in two steps may be a slow start (or a descheduled process on a busy host)
MAX_PERIOD = 64


def _field(seqs, name: str) -> dict:
    return seqs.field(name) if isinstance(seqs, SeqEntries) else {s: getattr(e, name) for s, e in seqs.items()}


def _arrivals(view: GroupView):
    """(ranks, seqs, arrival matrix seq x rank, class key per seq) over the seqs every member issued."""
    ranks = sorted(r for r, seqs in view.by_rank.items() if seqs)
    if len(ranks) < 2 or len(ranks) < len(view.members):
        return None
    common = sorted(set.intersection(*(set(view.by_rank[r]) for r in ranks)))
    if len(common) < MIN_SAMPLES:
        return None
    created = {r: _field(view.by_rank[r], "t_created") for r in ranks}
    started = {r: _field(view.by_rank[r], "t_started") for r in ranks}
    ops, sizes = _field(view.by_rank[ranks[0]], "op"), _field(view.by_rank[ranks[0]], "in_sizes")
    rows, keys, kept = [], [], []
    for seq in common:
        row = [created[r][seq] if created[r][seq] is not None else started[r][seq] for r in ranks]
        if any(t is None for t in row):
            continue
        rows.append(row)
        keys.append((ops[seq], repr(sizes[seq])))
        kept.append(seq)
    if len(rows) < MIN_SAMPLES:
        return None
    return ranks, kept, np.asarray(rows, dtype=np.float64), keys


def _step_period(rows: list[int], firsts: np.ndarray) -> tuple[float | None, int]:
    """The step, from one class's occurrences (their positions `rows` in the group's sequence): the smallest k
    for which every k-th occurrence is the same number of collectives later (the class occurs k times per step;
    three quarters of them, so a phase change or a call at start-up does not hide it), timed as the median of
    the first arrivals' differences. Also returns k (1 when no period is found)."""
    pos = np.asarray(rows)
    for k in range(1, min(MAX_PERIOD, len(pos) // 2) + 1):
        gaps = pos[k:] - pos[:-k]
        same = gaps == np.median(gaps)
        if np.mean(same) >= 0.75:
            return float(np.median((firsts[pos[k:]] - firsts[pos[:-k]])[same])), k
    return None, 1


def _bracket(late: np.ndarray, rows: list[int], seqs: list[int], keys: list[tuple], threshold: float) -> dict:
    """Where the late rank loses its time: from one occurrence of the class it is late at (the second: the
    first may be start-up's), back over the group's collectives while it is still late; the last one it was on
    time at and the first one it was late at bracket its slow phase."""
    k = rows[1] if len(rows) > 1 else rows[0]
    while k > 0 and late[k - 1] >= threshold:
        k -= 1
    out = {"late_from": {"seq": seqs[k], "op": keys[k][0]}}
    if k > 0:
        out["on_time_at"] = {"seq": seqs[k - 1], "op": keys[k - 1][0]}
    return out


def _timelines(views: dict[str, GroupView]) -> tuple[dict[int, tuple[list[float], list[tuple]]], dict[tuple, float]]:
    """Each rank's collectives in arrival order (arrivals, and (group, seq) beside them), and each collective's
    last arrival, where every member's arrival is known."""
    calls: dict[int, list[tuple[float, tuple]]] = defaultdict(list)
    last: dict[tuple, float] = {}
    for view in views.values():
        ranks = [r for r in view.members if view.by_rank.get(r)]
        arrivals = {r: _field(view.by_rank[r], "t_created") for r in ranks}
        for r in ranks:
            for seq, t in arrivals[r].items():
                if t is not None:
                    calls[r].append((t, (view.name, seq)))
        if len(ranks) < len(view.members):
            continue
        for seq in set.intersection(*(set(arrivals[r]) for r in ranks)) if ranks else ():
            times = [arrivals[r][seq] for r in ranks]
            if all(t is not None for t in times):
                last[(view.name, seq)] = max(times)
    out = {}
    for r, got in calls.items():
        got.sort(key=lambda x: x[0])
        out[r] = ([t for t, _ in got], [k for _, k in got])
    return out, last


def _held_before(timeline, last: dict[tuple, float], arrivals: np.ndarray, late: np.ndarray) -> bool:
    """Whether a late rank's lateness is time it spent held in a collective before: at most of the class's calls
    it was late at, another member arrived at one of its last HELD_BACK collectives after it, and it arrived
    here less than half its lateness after that member. A member that waits there for a late one (a gather's
    root, a broadcast's tree) leaves late and so arrives late at the next call, by no work of its own - and at
    the calls after it, through calls that hold it no more (a gather's other members wait for nobody). A rank
    slow by its own work is the last to arrive, and nobody holds it. The calls of the class it was on time at
    say nothing either way (one class can hold two calls of a step, DDP's buckets of one size: one after a call
    that held it, one after a call that did not)."""
    times, keys = timeline
    held = known = 0
    for t, x in zip(arrivals, late):
        if x < MIN_LATE_S:
            continue  # on time here: no lateness to explain
        i = bisect_left(times, t) - 1
        befores = [(times[j], last.get(keys[j])) for j in range(i, max(i - HELD_BACK, -1), -1)]
        if i < 0 or befores[0][1] is None:
            continue
        known += 1
        held += any(before is not None and before - mine >= MIN_LATE_S and t - before < max(MIN_LATE_S, x / 2)
                    for mine, before in befores)
    return held >= MIN_HELD and held * 2 > known


def _late_by_role(best: dict[int, dict], views: dict[str, GroupView],
                  class_late: dict[int, dict[tuple, float]]) -> list[int]:
    """Late ranks whose lateness is their place in the program, not their own: the member at the same position
    of every sibling group (same description and size, disjoint: the tensor-parallel groups of each replica) is
    late too, by at least half as much (judged late or not: the noise differs between groups; a sibling whose
    calls these dumps cannot time, a recorder-only member's beside Flight Recorder's, says nothing). Such a
    member does more work by its role (a scatter's root, the one that logs), and every replica shows it; a slow
    host or process shows in one of them only. A late rank whose siblings none of these dumps can time is marked
    `role_untold` in `best` (its finding says so)."""
    out = []
    for r, b in best.items():
        view = views[b["group"]]
        if r not in view.members:
            continue
        at = view.members.index(r)
        siblings = sibling_groups(view, views) if view.desc else []
        key = (b["op"], b["sizes"])  # the same collective of the sibling group, where these dumps time it
        timed = [class_late[o.members[at]][key] for o in siblings if key in class_late.get(o.members[at], {})]
        if timed and all(late >= b["late_s"] / 2 for late in timed):
            out.append(r)
        elif siblings and not timed:
            b["role_untold"] = True
    return out


def find_stragglers(views: dict[str, GroupView]) -> list[Finding]:
    timelines, last_arrival = _timelines(views)
    best: dict[int, dict] = {}
    all_late: dict[int, list[float]] = defaultdict(list)
    class_late: dict[int, dict[tuple, float]] = defaultdict(dict)  # rank -> (op, sizes) -> its median lateness
    last_count: dict[int, int] = defaultdict(int)  # collectives the rank arrived last at (kept for the JSON)
    samples = 0
    for view in views.values():
        got = _arrivals(view)
        if got is None:
            continue
        ranks, seqs, a, keys = got
        late = a - median_of_others(a)
        samples += len(a)
        for j in np.argmax(a, axis=1):
            last_count[ranks[j]] += 1
        firsts = a.min(axis=1)
        by_class: dict[tuple, list[int]] = defaultdict(list)
        for i, k in enumerate(keys):
            by_class[k].append(i)
        for (op, sizes), rows in by_class.items():
            if len(rows) < MIN_SAMPLES:
                continue
            x = late[rows]
            step, per_step = _step_period(rows, firsts)
            if len(rows) < MIN_STEPS * per_step:
                continue  # fewer than MIN_STEPS steps: not yet "consistently" late
            med, noise, is_late = judge_lateness(x, step_s=step)  # the one rule (world/lateness.py)
            for j, r in enumerate(ranks):
                all_late[r].append(float(med[j]))
                m = float(med[j])
                held = m >= MIN_LATE_S and _held_before(timelines[r], last_arrival, a[rows, j], x[:, j])
                # a lateness it was held into is no work of its own, nor of its place: it says nothing of the role,
                # judged late or not (a sibling held by the straggler's own group is as late, and noisier)
                own = 0.0 if held else m
                class_late[r][(op, sizes)] = max(own, class_late[r].get((op, sizes), float("-inf")))
                if not is_late[j] or held:
                    continue
                if r not in best or m > best[r]["late_s"]:
                    best[r] = {"late_s": m, "step_s": step, "group": view.name, "op": op, "sizes": sizes,
                               "samples": len(rows), "noise_s": noise, "seq": seqs[rows[0]],
                               "bracket": _bracket(late[:, j], rows, seqs, keys, max(MIN_LATE_S, m / 2)),
                               "others_ms": {str(q): round(float(med[i]) * 1e3, 2) for i, q in enumerate(ranks)
                                             if q != r}}
    out = []
    for r in _late_by_role(best, views, class_late):
        del best[r]
    for r, b in sorted(best.items()):
        share = f" ({b['late_s'] / b['step_s']:.0%} of a {b['step_s'] * 1e3:.0f} ms step)" if b["step_s"] else ""
        others = [v for v in b["others_ms"].values()]
        detail = (f"rank {r} arrives a median {b['late_s'] * 1e3:.0f} ms late{share} at {b['op']} on "
                  f"{fmt_group(b['group'])} ({b['samples']} calls, lateness noise ±{b['noise_s'] * 1e3:.1f} ms); "
                  f"the other ranks: {min(others):+.1f} to {max(others):+.1f} ms.")
        on_time, late_from = b["bracket"].get("on_time_at"), b["bracket"]["late_from"]
        if on_time:
            detail += (f" Each step it is on time at {on_time['op']} #{on_time['seq']} and late from "
                       f"{late_from['op']} #{late_from['seq']} on: the time is lost between the two.")
        if b.get("role_untold"):
            detail += (" Whether the rank or its place in the program is slow, these dumps cannot tell: the sibling "
                       "groups' calls at that point are not timed in them (ranks that left only the recorder's "
                       "trace cannot see the calls issued from C++). Not a finding: a rank whose role does more "
                       "work (a scatter's root, the one that logs) arrives as late on a healthy job.")
        out.append(Finding(
            "straggler", [r], group=b["group"], seq=b["seq"], op=b["op"], detail=detail,
            evidence={"late_ms": round(b["late_s"] * 1e3, 2), "last_arrivals": last_count[r], "collectives": samples,
                      "step_ms": round(b["step_s"] * 1e3, 2) if b["step_s"] else None,
                      "step_share": round(b["late_s"] / b["step_s"], 4) if b["step_s"] else None,
                      "collective": {"group": b["group"], "op": b["op"], "sizes": b["sizes"]},
                      "samples": b["samples"], "noise_ms": round(b["noise_s"] * 1e3, 3), **b["bracket"],
                      "median_late_ms": {str(q): round(float(np.max(v)) * 1e3, 2)
                                         for q, v in sorted(all_late.items())},
                      **({"role_untold": True} if b.get("role_untold") else {})}))
    if len(out) > 1:  # one line says which ranks, each finding says how late
        names = fmt_ranks([f.ranks[0] for f in out])
        for f in out:
            f.evidence["stragglers"] = names
    return out


def split_untold(found: list[Finding]) -> tuple[list[Finding], list[Finding]]:
    """(the stragglers that are claims, those whose role the dumps cannot tell): a lateness that every sibling
    replica's member at that place might share is no evidence that the rank is slow; reported apart
    (`unconfirmed`), never a finding, so that a healthy job whose dumps time no sibling reads OK."""
    return ([f for f in found if not f.evidence.get("role_untold")],
            [f for f in found if f.evidence.get("role_untold")])
