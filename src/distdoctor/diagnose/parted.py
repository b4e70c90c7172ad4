"""A rank whose calls part from its peers' in the code, where a member's dump is lost: it skipped a call, or
issued one more.

Gloo aborts a process (SIGABRT, no dump) whose peer passes a call of another kind or size, and its peers then
die of the reset connection: the dumps left hold no mismatch, only a missing one. Yet the ranks' call sites
still show who parted. When a rank's n-th collective on a group comes from the line where the others issued
their (n+1)-th, it skipped the call they made at n; when its (n+1)-th comes from the line of their n-th, it
issued one more before it. Either is a call it made that no other member made at that number - a different
collective, whatever its name: `type_mismatch`, ahead of the lost dump it explains.

Read only where a member of the group left no dump (elsewhere the calls themselves show the mismatch or the
absence), from user frames (the recorder's, Flight Recorder's pickle; its JSON form has none), at the first
number where the rank's site differs from what most of the others agree on, every earlier one agreeing. A rank
whose trace cannot see some calls (the recorder's alone, of a job that issues calls from C++: its numbers are
placed among the others', not counted by its communicator) is neither judged nor a judge.

A skipper whose next call was issued from C++ (DDP's gradient buckets) has no next call in its recorder's trace
to compare. Its communicator's frontier does (the trace header's `pg_status`, trace/frontier.py): under Gloo a
rank blocked in a Python call is in the last call its communicator enqueued, so the others' call #n is their
communicator's #E. A rank whose recorder shows fewer than n calls, yet whose communicator enqueued #E or more,
made some other call at #E, one its recorder did not see (`_parted_by_frontier`; recorder traces alone, of
blocking backends: under NCCL a Python call is not the last enqueued while the GPU runs behind).

The p2p form (`odd_message_before_lost`): Gloo aborts the receiver of a message of another size or dtype than it
posted for. The sender's own calls show it: a message none of its other calls with the lost rank carried, after
which none with that peer completed, the usual one passed twice before it.
"""

from __future__ import annotations

from collections import Counter

from distdoctor.diagnose.callsites import callsite, fmt_site
from distdoctor.diagnose.p2p import message_of
from distdoctor.diagnose.waitfor import p2p_entries
from distdoctor.findings.kinds import Finding, fmt_group, fmt_ranks
from distdoctor.trace.frontier import enqueued_collectives, frontiers, is_async


def parted_before_lost(views: dict, no_dump: list[int], ts=None) -> list[Finding]:
    """One finding per rank whose call sites (or, failing those, its communicator's frontier) show a skipped or
    an extra call on a group that lost a member."""
    found = []
    for name, view in sorted(views.items()):
        if not set(no_dump) & set(view.members):
            continue
        for rank in sorted(view.by_rank):
            part = _parted(view, rank)
            if part is not None:
                found.append(_finding(name, view, rank, *part))
        if not found and ts is not None:
            found.extend(_parted_by_frontier(name, view, ts) or _parted_by_completed(name, view, ts))
    return found


def odd_message_before_lost(ts, no_dump: list[int]) -> list[Finding]:
    """The p2p form: a rank's send or recv with a rank that left no dump, the last that completed with that peer
    or one posted after it, carrying a size or dtype none of its other calls with that peer carried (`_odd_one`):
    Gloo aborts the receiver of a message it did not expect, and it leaves no dump. One finding per such rank."""
    found = []
    for rank, t in sorted(ts.ranks.items()):
        calls: dict[tuple, list] = {}
        for e in p2p_entries(t):
            if e.peer in no_dump:
                calls.setdefault((e.op, e.group, e.peer), []).append(e)
        for (op, group, peer), es in sorted(calls.items(), key=lambda kv: str(kv[0])):
            odd = _odd_one(es)
            if odd is not None:
                found.append(_message_finding(rank, peer, *odd, es))
                break
    return found


def _odd_one(es: list) -> tuple | None:
    """(the call, the usual message): the call of `es` whose message no other call carried, after which no call with that peer completed (the
    peer died of it: the calls posted after it, as a batch of sends, stay open), where at least two calls before it
    carry the usual message, the one most of them carry. (The first calls may differ by design: a schedule's
    exchange of shapes, as a message of bytes.)"""
    kinds = Counter(message_of(e) for e in es)
    usual, n = kinds.most_common(1)[0]
    done = [i for i, e in enumerate(es) if e.state == "completed"]
    last = es[done[-1]:] if done else es
    odd = [e for e in last if kinds[message_of(e)] == 1]
    if len(es) < 3 or n < 2 or len(odd) != 1 or any(message_of(e) != usual for e in last if e is not odd[0]):
        return None
    before = es[:es.index(odd[0])]
    if sum(1 for e in before if message_of(e) == usual) < 2:
        return None  # the usual message not yet established: a schedule's first exchange differs by design
    return odd[0], usual


def _message_finding(rank: int, peer: int, e, usual: tuple, es: list) -> Finding:
    sizes, dtypes = message_of(e)
    kind = "dtype_mismatch" if dtypes != usual[1] else "size_mismatch"
    to = "to" if e.op == "send" else "from"
    site = callsite(e)
    detail = (f"rank {rank}'s {e.op} #{e.p2p_seq} {to} rank {peer} on group '{e.group}' carries sizes {sizes}, "
              f"dtypes {dtypes}, which none of its {len(es) - 1} other {e.op}s {to} rank {peer} carried (most carry "
              f"{usual[0]}, {usual[1]}){f' (from {fmt_site(site)})' if site else ''}. Rank {peer} left no dump: Gloo "
              f"aborts a process that receives a message it did not expect, and the others then die of the reset "
              f"connection (diagnose/parted.py).")
    return Finding(kind, [rank], group=e.group, seq=e.p2p_seq, op=e.op, t=e.t_created, detail=detail,
                   evidence={"parted": "message", "peer": peer, "usual": list(usual), "lost": [peer]})


def _frontier(ts, rank: int, group: str) -> int | None:
    """The last call the rank's communicator enqueued on the group, from its own recorder trace's frontier (a
    blocking backend's: under NCCL the numbers run ahead of the calls); None where the trace has none."""
    t = ts.ranks.get(rank)
    if t is None or t.source != "native" or is_async(t) or not t.pg_status:
        return None
    return enqueued_collectives(frontiers(t).get(group))


def _blocked_at(view, ts, enqueued: dict[int, int | None]) -> tuple[int, int, list[int]] | None:
    """(the group's number as the traces show it, the communicator's number, the ranks blocked there) where
    most members that hold a last call stopped: in the communicator's numbering, the last call of the members
    numbered by it (Flight Recorder's, merged or placed among them); in a group of the recorder's traces alone,
    each rank's last call in flight is the last its communicator enqueued (a blocking backend)."""
    counted = any(not _own_numbers(ts, r) for r in view.by_rank)
    held: dict[tuple[int, int], list[int]] = {}
    for r, calls in view.by_rank.items():
        if not calls:
            continue
        last = max(calls)
        if counted and not _own_numbers(ts, r) and not view.unseen.get(r):
            held.setdefault((last, last), []).append(r)
        elif not counted and calls[last].state != "completed" and enqueued[r] is not None:
            held.setdefault((last, enqueued[r]), []).append(r)
    if not held:
        return None
    (seq, at), who = max(held.items(), key=lambda kv: len(kv[1]))
    return seq, at, who


def _own_numbers(ts, rank: int) -> bool:
    """The rank's trace is the recorder's alone, numbered by its own calls, not placed among its
    communicator's (no Flight Recorder dump of its own or of a peer it was aligned with)."""
    t = ts.ranks.get(rank)
    m = (t.merged or {}) if t is not None else {}
    return t is not None and t.source == "native" and not (
        "flight_recorder_only" in m or m.get("renumbered_through") or m.get("placed_among_flight_recorder"))


def _parted_by_frontier(group: str, view, ts) -> list[Finding]:
    """The ranks whose communicator passed the number where most members are blocked, without their recorder
    holding that call where it would have shown it: a call issued from C++ met the others' (see the module's
    docstring)."""
    enqueued = {r: _frontier(ts, r, group) for r in view.by_rank}
    got = _blocked_at(view, ts, enqueued)
    if got is None:
        return []
    seq, at, who = got
    odd = []
    for r, calls in view.by_rank.items():
        enq = enqueued[r]
        if r in who or enq is None or enq < at or seq in calls or (calls and max(calls) > seq):
            continue
        if seq in view.unseen.get(r, ()):
            continue  # (placed among its communicator's calls, it cannot see this one: no proof it differs)
        odd.append(r)
    if not odd or len(who) < 2 or len(odd) >= len(who):
        return []
    return [_frontier_finding(group, view, sorted(odd), sorted(who), seq, at)]


def _completed(ts, rank: int, group: str) -> int | None:
    """The last call the rank's communicator completed on the group (`pg_status`, a blocking backend's, of a
    trace numbered by its own recorder's calls); None where the trace has none."""
    t = ts.ranks.get(rank)
    if t is None or t.source != "native" or is_async(t) or not t.pg_status or not _own_numbers(ts, rank):
        return None
    f = frontiers(t).get(group)
    return f.completed if f is not None and enqueued_collectives(f) is not None else None


def _parted_by_completed(group: str, view, ts) -> list[Finding]:
    """The ranks whose communicator completed the number by which most members had completed their call #n,
    while their recorder holds no #n: the call they completed there was another, issued from C++ (a skipped
    Python call met the next step's gradient buckets). Where the others went on past #n into calls their own
    recorders cannot see, nobody is blocked where `_parted_by_frontier` looks. #n's number in the communicator is
    at most the least any of its holders completed; a completed collective is one and the same call for every
    member."""
    done = {r: _completed(ts, r, group) for r in view.by_rank}
    last = {r: max((s for s, e in calls.items() if e.state == "completed"), default=0)
            for r, calls in view.by_rank.items() if done[r] is not None}
    if len(last) < 3:
        return []
    n = Counter(last.values()).most_common(1)[0][0]
    holders = sorted(r for r, k in last.items() if k >= n)
    bound = min(done[r] for r in holders)
    odd = sorted(r for r, k in last.items() if k < n and n not in view.by_rank[r] and done[r] >= bound
                 and not view.unseen.get(r))
    if n < 1 or not odd or len(holders) < 2 or len(odd) >= len(holders):
        return []
    e = view.by_rank[holders[0]][n]
    lost = [r for r in view.members if r not in view.by_rank]
    site = callsite(e)
    its = "its" if len(odd) == 1 else "their"
    detail = (f"{fmt_ranks(holders)} completed {e.op} #{n} on {fmt_group(group, view.desc)}"
              f"{f' from {fmt_site(site)}' if site else ''}, by call #{bound} of their communicators at the latest; "
              f"{fmt_ranks(odd)}, whose communicator completed #{min(done[r] for r in odd)} or later, never issued "
              f"it, which {its} recorder would have shown: the call {fmt_ranks(odd)} completed there was another, "
              f"issued from C++ ({'it' if len(odd) == 1 else 'they'} skipped that call, or issued one more before "
              f"it). {fmt_ranks(lost)} left no dump: Gloo aborts a process whose peer passes a call of another kind "
              f"or size, and the others then die of the reset connection (diagnose/parted.py).")
    return [Finding("type_mismatch", odd, group=group, seq=n, op=e.op, t=e.t_created, detail=detail,
                    evidence={"parted": "completed", "communicator_seq": bound, "others": holders, "lost": lost})]


def _frontier_finding(group: str, view, odd: list[int], who: list[int], seq: int, at: int) -> Finding:
    e = view.by_rank[who[0]][seq]
    lost = [r for r in view.members if r not in view.by_rank]
    site = callsite(e)
    their, its = ("its" if len(who) == 1 else "their"), ("its" if len(odd) == 1 else "their")
    numbered = f", which {their} communicator numbers #{at}" if at != seq else ""
    detail = (f"{fmt_ranks(who)} {'is' if len(who) == 1 else 'are'} in {e.op} #{seq} on {fmt_group(group, view.desc)}"
              f"{f' from {fmt_site(site)}' if site else ''}{numbered}; {fmt_ranks(odd)} never issued that call, "
              f"which {its} recorder would have shown, yet {its} communicator enqueued #{at} or later: a call "
              f"issued from C++ met theirs there ({fmt_ranks(odd)} skipped that call, or issued one more before "
              f"it). {fmt_ranks(lost)} left no dump: Gloo aborts a process whose peer passes a call of another kind "
              f"or size, and the others then die of the reset connection (diagnose/parted.py).")
    return Finding("type_mismatch", odd, group=group, seq=seq, op=e.op, t=e.t_created, detail=detail,
                   evidence={"parted": "frontier", "communicator_seq": at, "others": who, "lost": lost})


def _agreed(view, rank: int, seq: int, least: int = 2) -> tuple[tuple, list[int]] | None:
    """The site most of the other members called collective `seq` from (a strict majority of those whose
    dumps show it, `least` at least), and who they are."""
    theirs: dict[tuple, list[int]] = {}
    for r, calls in view.by_rank.items():
        e = calls.get(seq) if r != rank and not view.unseen.get(r) else None
        if e is not None and (site := callsite(e)):
            theirs.setdefault(site, []).append(r)
    if not theirs:
        return None
    site, who = max(theirs.items(), key=lambda kv: len(kv[1]))
    shown = sum(len(v) for v in theirs.values())
    return (site, who) if len(who) >= least and 2 * len(who) > shown else None


def _parted(view, rank: int) -> tuple[int, str, tuple, tuple, list[int]] | None:
    """(seq, 'skipped' or 'extra', the rank's site, the others' site at seq, the ranks that show it: those
    that issued `seq + 1` from the rank's site, or agreed on `seq`) at the first number where the rank's site
    differs from the others' agreed one, when the next number shows which; else None."""
    mine = view.by_rank.get(rank) or {}
    if view.unseen.get(rank):
        return None  # numbered among calls it cannot see (the recorder's, of a job that issues calls from C++)
    for seq in sorted(mine):
        site = callsite(mine[seq])
        agreed = _agreed(view, rank, seq)
        if not site or agreed is None:
            return None
        if site == agreed[0]:
            continue
        after = _agreed(view, rank, seq + 1, least=1)  # the others ahead show where their next call came from
        nxt = mine.get(seq + 1)
        if after is not None and after[0] == site:
            return seq, "skipped", site, agreed[0], after[1]
        if nxt is not None and callsite(nxt) == agreed[0]:
            return seq, "extra", site, agreed[0], agreed[1]
        return None
    return None


def _finding(group: str, view, rank: int, seq: int, how: str, site: tuple, theirs: tuple,
             who: list[int]) -> Finding:
    e = view.by_rank[rank][seq]
    lost = [r for r in view.members if r not in view.by_rank]
    if how == "skipped":
        what = (f"it comes from {fmt_site(site)}, where {fmt_ranks(who)} issued {'its' if len(who) == 1 else 'their'} "
                f"#{seq + 1}; the others' #{seq} comes from {fmt_site(theirs)}: rank {rank} skipped that call")
    else:
        what = (f"it comes from {fmt_site(site)}, and its #{seq + 1} from {fmt_site(theirs)}, where {fmt_ranks(who)} "
                f"issued their #{seq}: rank {rank} issued one call more")
    detail = (f"rank {rank}'s {e.op} #{seq} on {fmt_group(group, view.desc)} is another call than the others' "
              f"#{seq}: {what}. {fmt_ranks(lost)} left no dump: Gloo aborts a process whose peer passes a call of "
              f"another kind or size, and the others then die of the reset connection (diagnose/parted.py).")
    return Finding("type_mismatch", [rank], group=group, seq=seq, op=e.op, t=e.t_created, detail=detail,
                   evidence={"parted": how, "site": fmt_site(site), "others_site": fmt_site(theirs), "others": who,
                             "lost": lost})
