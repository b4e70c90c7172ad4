"""Root causes from where each rank's CPU and GPU stand per group (NCCL's frontiers, trace/model.py).

Under NCCL a collective call returns once the CPU has enqueued it; the group's stream on the GPU runs it later,
in the group's order, and it completes when every member's stream has reached it: members of a group complete a
collective together. So, on a group whose members' frontiers count the same collectives (not a p2p-only group,
whose counts differ between members by design):

- gpu_stopped: a rank completed less than a peer on a group they share, although its CPU enqueued beyond what it
  completed. Its peers completed collectives it was part of: its GPU stopped completing (or reporting) work. With
  collective timing on, the same holds of the started frontier (a peer's stream started a collective this rank's
  stream has enqueued and not started).
  On a p2p group the same shows pair by pair: the rank's send (recv) is not completed while its peer completed
  the matching recv (send) - pairs match in posting order, so only where the dumps list the completed calls
  (full dumps; an active-only dump drops them and says nothing here).
- cpu_stopped: a rank's GPU has done everything its CPU gave it on every group, and on a group its peers
  enqueued further and completed exactly as far as it enqueued: they wait for its next collective, which its CPU
  never enqueued (the CPU stopped or went elsewhere: a hang in Python, a data loader, a lock).

The ranks of each class are one finding (every faulty rank named), with the group where they lag most, the
collective there, and the frontiers as evidence. The frontiers' completions also tell the matcher which
collectives a member completed although an active-only dump no longer lists them (apply_frontiers).

What the frontiers cannot tell: a snapshot with collective timing off, where every member has enqueued a
collective none has completed, shows a GPU in flight exactly as it shows GPUs stalled together; and a rank whose
CPU is slower than its peers' GPUs looks, caught at that moment, like one that stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.findings.kinds import Finding, fmt_group, fmt_ranks
from distdoctor.diagnose.progress import header_call
from distdoctor.diagnose.match import GroupView
from distdoctor.diagnose.waitfor import p2p_index
from distdoctor.trace.frontier import Frontier, frontiers, is_async
from distdoctor.trace.model import TraceSet
from distdoctor.trace.summary import summarize


def is_async_set(ts: TraceSet) -> bool:
    """Every loaded rank's backend runs collectives asynchronously (NCCL, XCCL)."""
    return bool(ts.ranks) and all(is_async(t) for t in ts.ranks.values())


@dataclass
class Standing:
    """Where every rank stands, read once: per rank its frontiers; per group the comparable ones (see
    group_frontiers); the sends and receives indexed for pairing (waitfor.p2p_index)."""
    by_rank: dict[int, dict[str, Frontier]]
    by_group: dict[str, dict[int, Frontier]]
    p2p: dict


def standing(ts: TraceSet) -> Standing:
    """Only the dumps' own record counts (pg_status): a dump without it says nothing of where its GPU stands."""
    by_rank = {r: frontiers(t) for r, t in ts.ranks.items() if t.pg_status}
    return Standing(by_rank, group_frontiers(by_rank), p2p_index(ts))


def group_frontiers(by_rank: dict[int, dict[str, Frontier]]) -> dict[str, dict[int, Frontier]]:
    """group -> rank -> frontier, for the groups whose members' frontiers count the same collectives and come
    from the dumps' own record (pg_status): an entry's state is a mark the watchdog sets when it looks, which
    the other analyses already read (state_mismatch)."""
    out: dict[str, dict[int, Frontier]] = {}
    for r, fs in by_rank.items():
        for g, f in fs.items():
            out.setdefault(g, {})[r] = f
    return {g: fs for g, fs in out.items() if len(fs) > 1 and all(f.source == "pg_status" for f in fs.values())
            and all(f.space in ("collective", "unknown") for f in fs.values())
            and any(f.space == "collective" for f in fs.values())}


def apply_frontiers(views: dict[str, GroupView], st: Standing) -> None:
    """What each member completed, as its frontier says, into the matcher's views (an active-only dump lists no
    completed collective)."""
    for g, fs in st.by_group.items():
        view = views.get(g)
        if view is None:
            continue
        for r, f in fs.items():
            if f.completed is not None and f.completed > view.last_completed.get(r, -1):
                view.last_completed[r] = f.completed
        view._lowest = None  # the cache of least_completed_by_others


def _p2p_lags(idx: dict) -> dict[str, dict[int, int]]:
    """group -> rank -> how many of its sends/recvs are not completed although the peer completed the other half."""
    out: dict[str, dict[int, int]] = {}
    for (g, sender, receiver, kind), mine in idx.items():
        theirs = idx.get((g, sender, receiver, "recv" if kind == "send" else "send"), [])
        rank = sender if kind == "send" else receiver
        for e, other in zip(mine, theirs):
            if e.state != "completed" and other.state == "completed":
                lag = out.setdefault(g, {})
                lag[rank] = lag.get(rank, 0) + 1
    return out


def busy_ranks(st: Standing) -> set[int]:
    """Ranks whose GPU still has work their CPU enqueued (on some group): a CPU that has not yet enqueued what its
    peers did is then waiting at a sync point for its own GPU, which runs - it is behind, not stopped."""
    return {r for r, fs in st.by_rank.items() if not _caught_up(fs.values())}


def prepare(ts: TraceSet, views: dict[str, GroupView]) -> Standing | None:
    """Under NCCL, where every rank stands, its completions told to the matcher's views; None otherwise."""
    if not is_async_set(ts):
        return None
    st = standing(ts)
    apply_frontiers(views, st)
    return st


def split_waits(ts: TraceSet, views: dict[str, GroupView], st: Standing | None, waits: list, pending: dict,
                looped: set[int]) -> tuple[list, dict, dict, list, set[int]]:
    """The waits that hold ranks up under NCCL, and each rank's calls split into those it is blocked in and
    those running on the GPU (every member reached them); the waits that prove nothing (with why, see
    unproven) unless their rank is on a cycle within one group; the busy ranks. Without NCCL (`st` None): the
    waits and calls as they are, nothing running, nothing unproven, nobody busy."""
    if st is None:
        return waits, pending, {}, [], set()
    busy = busy_ranks(st)
    behind = [(w, why) for w in waits if w.rank not in looped for why in [unproven(w, views, busy, st, ts)] if why]
    dropped = {id(b) for b, _ in behind}
    waits = [w for w in waits if id(w) not in dropped]
    waiting_in = {id(w.entry) for w in waits}
    in_flight = {r: [e for e in es if id(e) not in waiting_in] for r, es in pending.items()}
    pending = {r: [e for e in es if id(e) in waiting_in] for r, es in pending.items()}
    return waits, pending, in_flight, behind, busy


def unproven(w, views: dict[str, GroupView], busy: set[int], st: Standing, ts: TraceSet) -> str:
    """Why wait `w` proves no one holds it up under NCCL ("" when it does):
    - it waits only for busy ranks that will get there once their GPU catches up: a collective they have not
      issued yet, or a send/recv (an active-only dump has dropped the completed ones, so which of a pair's calls
      match cannot be counted; a p2p cycle within one group is kept by the caller);
    - a send/recv whose peer did all it enqueued on the group and lists nothing there: whether it posted the
      match is not in an active-only dump (it completed, or was never posted)."""
    if not w.waits_for:
        return ""
    if set(w.waits_for) <= busy:
        if w.entry.is_p2p:
            return "their GPU still runs earlier work"
        view = views.get(w.entry.group)
        if view is not None and all(view.by_rank.get(m, {}).get(w.entry.seq) is None for m in w.waits_for):
            return "their GPU still runs earlier work"
    if w.entry.is_p2p and all(_done_and_dropped(m, w.entry.group, st, ts) for m in w.waits_for):
        return UNSHOWN
    return ""


UNSHOWN = "it did all it enqueued there and its dump lists none of it: whether it posted the match is not shown"


def unshown_pairs(behind: list, named: set[int], views: dict[str, GroupView]) -> list[Finding]:
    """Sends/recvs that wait for an idle peer whose active-only dump lists nothing on the group: the peer never
    posted the match (its CPU stopped or went elsewhere), or the waiting rank's GPU completed the call and never
    said so. Nothing tells which: one finding per group, "one of" each pair, unless a finding names either."""
    by_group: dict[str, list] = {}
    for w, why in behind:
        if why == UNSHOWN and w.rank not in named and not named.intersection(w.waits_for):
            by_group.setdefault(w.entry.group, []).append(w)
    out = []
    for g, ws in sorted(by_group.items()):
        pairs = sorted({(w.rank, p) for w in ws for p in w.waits_for})
        desc = views[g].desc if g in views else ""
        e = ws[0].entry
        detail = (f"on {fmt_group(g, desc)}, " + "; ".join(
            f"rank {w.rank}'s {w.entry.op} #{w.entry.p2p_seq} {'to' if w.entry.op == 'send' else 'from'} "
            f"rank {w.waits_for[0]}" for w in ws[:4])
                  + (f" (and {len(ws) - 4} more)" if len(ws) > 4 else "") + " never completed, and the peer did all it "
                  "enqueued on the group: one of each pair " + ", ".join(f"({a}, {b})" for a, b in pairs[:8])
                  + " is at fault - the peer never posted the match (its CPU stopped or went elsewhere), or the "
                  "waiting rank's GPU completed the call and never said so. An active-only dump drops completed calls, "
                  "so it cannot tell which; a full dump (the ring) can.")
        out.append(Finding("missing_ranks", sorted({r for pair in pairs for r in pair}), group=g, seq=e.p2p_seq,
                           op=e.op, t=e.t_created, detail=detail, evidence={"undecided": True, "pairs": pairs}))
    return out


def _done_and_dropped(rank: int, group: str, st: Standing, ts: TraceSet) -> bool:
    f = st.by_rank.get(rank, {}).get(group)
    t = ts.ranks.get(rank)
    return f is not None and t is not None and f.enqueued == f.completed and group not in summarize(t).groups


def _gpu_lags(fs: dict[int, Frontier]) -> dict[int, int]:
    """rank -> how many collectives it lags the member that completed (or started) most."""
    out: dict[int, int] = {}
    for attr in ("completed", "started"):
        known = {r: getattr(f, attr) for r, f in fs.items() if getattr(f, attr) is not None}
        if len(known) < 2:
            continue
        top = max(known.values())
        for r, v in known.items():
            if v < top and fs[r].enqueued is not None and fs[r].enqueued > v:
                out[r] = max(out.get(r, 0), top - v)
    return out


def _caught_up(fs_of_rank) -> bool:
    """The rank's GPU did all its CPU enqueued, on every group (p2p ones included)."""
    return all(f.enqueued == f.completed for f in fs_of_rank)


def _cpu_behind(fs: dict[int, Frontier], idle: set[int]) -> dict[int, int]:
    """rank -> how many collectives its peers enqueued beyond it, for idle ranks the group waits for."""
    enq = {r: f.enqueued for r, f in fs.items() if f.enqueued is not None}
    done = [f.completed for f in fs.values() if f.completed is not None]
    if len(enq) < 2 or not done:
        return {}
    top, gpu = max(enq.values()), max(done)
    return {r: top - e for r, e in enq.items() if r in idle and e < top and e == gpu}


def findings(ts: TraceSet, views: dict[str, GroupView], st: Standing) -> list[Finding]:
    """gpu_stopped then cpu_stopped findings (see the module's docstring)."""
    by_group = st.by_group
    idle = {r for r, fs in st.by_rank.items() if _caught_up(fs.values())}
    gpu = {g: lag for g, fs in by_group.items() if (lag := _gpu_lags(fs))}
    for g, lag in _p2p_lags(st.p2p).items():
        gpu.setdefault(g, {}).update({r: n for r, n in lag.items() if r not in gpu[g]})
    cpu = {g: lag for g, fs in by_group.items() if (lag := _cpu_behind(fs, idle))}
    out = []
    if gpu:
        out.append(_finding("gpu_stopped", gpu, ts, views, st))
    cpu_ranks = {r for lag in cpu.values() for r in lag} - {r for lag in gpu.values() for r in lag}
    if cpu_ranks:
        cpu = {g: {r: n for r, n in lag.items() if r in cpu_ranks} for g, lag in cpu.items()}
        out.append(_finding("cpu_stopped", {g: lag for g, lag in cpu.items() if lag}, ts, views, st))
    out += stalled_together(ts, views, st, {r for f in out for r in f.ranks})
    return out + idle_cpus(ts, st, {r for f in out for r in f.ranks})


def idle_cpus(ts: TraceSet, st: Standing, named: set[int]) -> list[Finding]:
    """Ranks whose recorder confirmed a hang with nothing in flight: no call blocked, and their GPU completed all
    their CPU enqueued on every group (pg_status), for the hang timeout. Nothing but their CPU holds them; with
    peers, the frontier rule above says the same from the peers' side (they enqueued further and wait)."""
    idle = {}
    for r, t in ts.ranks.items():
        h = t.hang if isinstance(t.hang, dict) else None
        mine = (h or {}).get("this_rank") or {}
        fs = st.by_rank.get(r) or {}
        if (h and h.get("status") == "confirmed" and not mine.get("blocked_in") and r not in named and fs
                and all(f.source == "pg_status" for f in fs.values()) and _caught_up(fs.values())):
            idle[r] = (mine.get("idle_for_s") or 0.0, fs)
    if not idle:
        return []
    ranks = sorted(idle)
    longest = max(s for s, _ in idle.values())
    where = "; ".join(f"rank {r}: " + ", ".join(f"group {g} up to #{f.completed}" for g, f in sorted(fs.items())[:3])
                      for r, (_, fs) in sorted(idle.items())[:4])
    detail = (f"{fmt_ranks(ranks)}: {'its' if len(ranks) == 1 else 'their'} CPU stopped issuing work (or went "
              f"elsewhere): {'its' if len(ranks) == 1 else 'their'} GPU completed all it enqueued ({where}) and "
              f"nothing new came for {longest:.1f} s, the hang timeout - no collective in flight, on the CPU or the "
              "GPU. Where the CPU stands is in its stack.")
    evidence = {"frontiers": {str(r): {g: _fjson(f) for g, f in sorted(fs.items())} for r, (_, fs) in idle.items()},
                "idle_for_s": {str(r): s for r, (s, _) in idle.items()}}
    return [Finding("cpu_stopped", ranks, detail=detail, evidence=evidence)]


def _watched(ts: TraceSet) -> dict[int, dict]:
    """rank -> the call its recorder's watchdog saw in flight past the hang threshold (a suspected or confirmed
    hang), with for how long: the dump was made because that call did not complete."""
    out = {}
    for r, t in ts.ranks.items():
        call = header_call(t)
        if call is not None:
            out[r] = {**call, "for_s": t.hang["this_rank"].get("blocked_for_s")}
    return out


def stalled_together(ts: TraceSet, views: dict[str, GroupView], st: Standing, named: set[int]) -> list[Finding]:
    """A collective every member of its group enqueued and none completed, which a member's watchdog saw in flight
    past the hang threshold. Peers' frontiers cannot single anyone out here (they stand level), so the rest of the
    evidence speaks: members whose stream has not started it while another's has (collective timing on) are the
    stopped GPUs; every member started it and none completed: the collective itself is stuck (transport); no
    start known: one of the members' GPUs stopped - exactly that one on a group of one (a one-rank world)."""
    out = []
    for g, calls in _by_group(_watched(ts)).items():
        view = views.get(g)
        members = list(view.members) if view is not None else sorted(calls)
        fs = {r: st.by_rank.get(r, {}).get(g) for r in members}
        if not fs or named & set(fs) or any(f is None or f.source != "pg_status" or f.enqueued is None
                                            or f.completed is None for f in fs.values()):
            continue
        done = {f.completed for f in fs.values()}
        seq = min(done) + 1
        if len(done) != 1 or any(f.enqueued < seq for f in fs.values()):
            continue  # some member is ahead or behind: the frontier rules above speak for this group
        out.append(_stalled(g, seq, fs, calls, ts, views))
    return out


def _by_group(watched: dict[int, dict]) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for r, call in sorted(watched.items()):
        out.setdefault(call["group"], {})[r] = call
    return out


def _stalled(g: str, seq: int, fs: dict[int, Frontier], calls: dict[int, dict], ts: TraceSet,
             views: dict[str, GroupView]) -> Finding:
    started = {r: f.started for r, f in fs.items()}
    timed = all(v is not None for v in started.values())
    inside = sorted(r for r, v in started.items() if timed and v >= seq)
    ranks = sorted(r for r in fs if r not in inside) if inside and len(inside) < len(fs) else sorted(fs)
    kind = "stuck_collective" if timed and len(inside) == len(fs) else "gpu_stopped"
    desc = views[g].desc if g in views else ""
    op = _op_at(ts, g, seq, sorted(fs)) or next(iter(calls.values())).get("op")
    longest = max((c.get("for_s") or 0.0 for c in calls.values()), default=0.0)
    where = f"{op or 'collective'} #{seq} on {fmt_group(g, desc)}"
    head = (f"{fmt_ranks(ranks)}: " if len(ranks) == 1 else f"one of {fmt_ranks(ranks)}: ")
    frontier = ", ".join(f"rank {r} enqueued up to #{f.enqueued}, completed up to #{f.completed}"
                         for r, f in sorted(fs.items())[:4]) + (" ..." if len(fs) > 4 else "")
    if kind == "stuck_collective":
        why = (f"every member's GPU started {where} and none completed it for {longest:.1f} s ({frontier}): the "
               "collective itself is stuck (transport, or NCCL inside it), not a rank that stopped.")
    elif len(ranks) == 1 and len(fs) == 1:
        why = (f"its GPU stopped completing work: {where} was enqueued and its GPU has not completed it for "
               f"{longest:.1f} s ({frontier}); it is the group's only member, so nothing but its own GPU holds it "
               "(a kernel queued ahead of it that does not end, or a GPU fault).")
    elif inside:
        why = (f"{'its' if len(ranks) == 1 else 'their'} GPU stream has not started {where} while "
               f"{fmt_ranks(inside)} started it and wait; none completed it for {longest:.1f} s ({frontier}).")
    else:
        why = (f"every member enqueued {where} and none completed it for {longest:.1f} s ({frontier}); a GPU that "
               "stopped on one of them holds them all, and which one is not shown: with collective timing on "
               "(TORCH_NCCL_ENABLE_TIMING=1) the started frontier tells.")
    evidence = {"frontiers": {g: {str(r): _fjson(f) for r, f in sorted(fs.items())}}, "group_desc": desc,
                "watched": {str(r): c for r, c in sorted(calls.items())}}
    if len(ranks) > 1 and kind == "gpu_stopped":
        evidence["undecided"] = True
    return Finding(kind, ranks, group=g, groups=[g], seq=seq, op=op, detail=head + why, evidence=evidence)


def _finding(kind: str, lags: dict[str, dict[int, int]], ts: TraceSet, views: dict[str, GroupView],
             st: Standing) -> Finding:
    ranks = sorted({r for lag in lags.values() for r in lag})
    # The group where most of the ranks lag together, then by most collectives behind; a p2p group (pairs of
    # calls, not frontiers, show it) only when no collective group does.
    coll = {name: lag for name, lag in lags.items() if name in st.by_group} or lags
    g = max(sorted(coll), key=lambda name: (len(coll[name]), sum(coll[name].values())))
    by_group = {**st.by_group, **{n: _frontiers_on(st, n) for n in lags if n not in st.by_group}}
    fs = by_group[g]
    desc = views[g].desc if g in views else ""
    first = min(lags[g])
    seq = (fs[first].completed if kind == "gpu_stopped" else fs[first].enqueued)
    seq = None if seq is None else seq + 1
    op = _op_at(ts, g, seq, [first] + [r for r in fs if r != first])
    evidence = {"frontiers": {name: {str(r): _fjson(f) for r, f in sorted(by_group[name].items())}
                              for name in sorted(lags, key=lambda n: (-len(lags[n]), n))},
                "lag": {name: {str(r): n for r, n in sorted(lag.items())} for name, lag in sorted(lags.items())},
                "group_desc": desc}
    detail = _detail(kind, ranks, fmt_group(g, desc), fs, lags[g], seq, op, g not in st.by_group)
    if len(lags) > 1:
        detail += " Also behind on " + ", ".join(
            f"{fmt_group(n, views[n].desc if n in views else '')} ({fmt_ranks(sorted(lags[n]))})"
            for n in sorted(lags, key=int if all(x.isdigit() for x in lags) else str) if n != g) + "."
    return Finding(kind, ranks, group=g, groups=sorted(lags), seq=seq, op=op, detail=detail, evidence=evidence)


def _detail(kind: str, ranks: list[int], where: str, fs: dict[int, Frontier], lag: dict[int, int], seq, op,
            p2p: bool) -> str:
    """The finding's sentence: who stopped, and each one's frontier beside its peers' on the group `where`."""
    theirs = "its" if len(ranks) == 1 else "their"
    gpu = kind == "gpu_stopped"
    head = f"{fmt_ranks(ranks)}: {theirs} " + ("GPU stopped completing work" if gpu else
                                               "CPU stopped issuing work (or went elsewhere)") + f". On {where}, "
    if p2p:  # a p2p group: pairs of calls show it
        return head + ", ".join(f"rank {r} has {n} send/recv not completed whose other half its peer completed"
                                for r, n in sorted(lag.items())) + " (pairs match in posting order)."
    attr = "completed" if gpu else "enqueued"
    others = [r for r in fs if r not in lag]
    peers = fmt_ranks(others) if others else "its peers"
    top = max(getattr(f, attr) for f in fs.values() if getattr(f, attr) is not None)
    mine = ", ".join(f"rank {r} " + (f"completed up to #{fs[r].completed} and enqueued up to #{fs[r].enqueued}"
                                     if gpu else f"enqueued up to #{fs[r].enqueued} and its GPU completed all of it")
                     for r in sorted(lag))
    if gpu:
        return head + mine + (f", while {peers} completed up to #{top}: the CPU ran ahead, the GPU did not follow "
                              f"({op or 'the collective'} #{seq} is the first it did not complete).")
    return head + mine + (f", while {peers} enqueued up to #{top} and wait in #{seq}" + (f" ({op})" if op else "")
                          + f", which {theirs} CPU never enqueued.")


def _frontiers_on(st: Standing, group: str) -> dict[int, Frontier]:
    return {r: fs[group] for r, fs in st.by_rank.items() if group in fs}


def _op_at(ts: TraceSet, group: str, seq: int | None, ranks: list[int]) -> str | None:
    """The collective #seq on `group` as the first of `ranks` that lists it names it."""
    if seq is None:
        return None
    for r in ranks:
        t = ts.ranks.get(r)
        if t is None:
            continue
        for i, (g, s) in enumerate(zip(t.column("group"), t.column("seq"))):
            if g == group and s == seq:
                return t.entries[i].op
    return None


def _fjson(f: Frontier) -> dict:
    return {"enqueued": f.enqueued, "started": f.started, "completed": f.completed, "source": f.source}


def add_progress(progress: dict[int, dict], st: Standing) -> None:
    """Each rank's frontiers in its progress record (`frontiers`), and what they say it completed per group where
    an active-only dump lists nothing completed (`completed`)."""
    for r, fs in st.by_rank.items():
        p = progress.get(r)
        if p is None:
            continue
        p["frontiers"] = {g: _fjson(f) for g, f in sorted(fs.items())}
        for g, f in fs.items():
            if g in st.by_group and f.completed and f.completed > p["completed"].get(g, 0):
                p["completed"][g] = f.completed
