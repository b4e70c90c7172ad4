"""A rank whose sends and receives part from those of the ranks that play its role (`lone_departure`).

A pipeline's middle stages run one program relative to their neighbours: receive from the stage before, send to
the stage after, and back. Written with each peer as an offset from the rank (-1, +1), their calls read alike,
call by call. A stage that skips a send, issues one twice or to the wrong peer parts from them at that call and
soon waits for a peer that waits for it (a cycle of p2p waits, or a peer that never posts its half). Its own
history shows it only after two whole rounds (p2p.py, `breaks_pattern`); the other stages show it at once
(fuzz run 75-12: GPipe on 8 ranks, a send skipped in the second step, named with its victim as one cycle).

So a rank departs alone where: at least MIN_ROLE other ranks made, relative to their peers, the very calls it
made for its first `j` calls (j >= MIN_SHARED, sends and receives both) and then all the same call `j + 1`,
which it did not; no rank matched its own call there; the peer of that call waits for it (`_awaited`); it made at most MAX_AFTER calls after it (what stopped it
followed from it); and every other rank that shares MIN_SHARED calls with it keeps to the calls of that role
as far as it went. Stages whose programs differ by design (1F1B's warm-up grows shorter down the pipeline)
part from each other like a staircase, more than one rank departing from any role: no one is named.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.diagnose.waitfor import p2p_entries, whole_p2p
from distdoctor.findings.kinds import fmt_ranks, nth
from distdoctor.trace.model import TraceSet

MIN_SHARED = 4  # calls a rank shares with the ranks of its role before the one it departs at
MIN_ROLE = 2  # ranks of its role that agree on the call it departed from
MAX_AFTER = 4  # calls it may make after the departure (a send completes into a buffer, a recv comes in)


@dataclass(frozen=True)
class Departure:
    rank: int
    at: int  # the index (0-based) of its call that departs, among its sends and receives
    got: tuple  # (op, group, peer offset) of that call
    want: tuple  # what each rank of its role made there
    role: list[int]


def relative_calls(ts: TraceSet, rank: int, cache: dict) -> list[tuple]:
    """The rank's sends and receives, each as (op, group, its peer - the rank); none where its trace holds a tail
    of them (a live state's, a wrapped ring's): calls that do not start at the first read alike by chance."""
    if rank not in cache:
        entries = [e for e in p2p_entries(ts.ranks[rank]) if e.peer is not None]
        cache[rank] = [(e.op, e.group, e.peer - rank) for e in entries] if whole_p2p(entries) else []
    return cache[rank]


def lone_departure(ts: TraceSet, rank: int, cache: dict | None = None) -> Departure | None:
    """The call at which `rank` departs from the ranks of its role (see above), else None. Ranks whose calls read
    alike are compared once (a pipeline of a thousand stages has a few programs)."""
    cache = {} if cache is None else cache
    mine = relative_calls(ts, rank, cache)
    seqs = {s: rs for s, rs in ((s, [b for b in rs if b != rank]) for s, rs in _by_sequence(ts, cache).items()) if rs}
    shared = {s: _common(mine, s) for s in seqs}
    j = max(shared.values(), default=0)
    if j >= len(mine) or j < MIN_SHARED or len(mine) - j - 1 > MAX_AFTER \
            or not {op for op, _, _ in mine[:j]} >= {"send", "recv"}:
        return None
    roles = [s for s, n in shared.items() if n == j and len(s) > j]
    role = sorted(b for s in roles for b in seqs[s])
    wanted = {s[j] for s in roles}
    if len(role) < MIN_ROLE or len(wanted) != 1:
        return None
    longest = max(roles, key=len)
    kin = [s for s, n in shared.items() if n >= MIN_SHARED and s not in roles]
    if not all(_keeps_to(s, longest) for s in roles + kin):
        return None  # the role's ranks disagree among themselves, or another rank parts from the role too:
        # roles that differ by design (a staircase), no role to read the rank against
    want = wanted.pop()
    if not _awaited(ts, rank, want):
        return None
    return Departure(rank, j, mine[j], want, role)


def _by_sequence(ts: TraceSet, cache: dict) -> dict[tuple, list[int]]:
    """Every rank's relative calls, the ranks that made each sequence."""
    if "by_sequence" not in cache:
        found: dict[tuple, list[int]] = {}
        for b in ts.ranks:
            seq = tuple(relative_calls(ts, b, cache))
            if seq:
                found.setdefault(seq, []).append(b)
        cache["by_sequence"] = found
    return cache["by_sequence"]


def _awaited(ts: TraceSet, rank: int, want: tuple) -> bool:
    """Whether the peer of the call the role makes there waits for it, blocked in the other half (a send that
    completed into a buffer is no wait: a schedule sends ahead by design). A rank whose program differs by
    design (the last of three stages alike, where one stage differs) made another call, but nobody waits for
    the one its role makes."""
    op, group, offset = want
    peer = rank + offset
    if peer not in ts.ranks:
        return False
    last = p2p_entries(ts.ranks[peer])
    half = "recv" if op == "send" else "send"
    return bool(last) and last[-1].state != "completed" and (last[-1].op, last[-1].group, last[-1].peer) == (
        half, group, rank)


def departure_text(d: Departure) -> str:
    """What the departure was, in words."""
    n = d.at + 1
    return (f"rank {d.rank}'s sends and receives, each peer taken relative to the rank, matched those of "
            f"{fmt_ranks(d.role)} call for call for {d.at} calls; its {nth(n)} send or receive was "
            f"{_said(d.got, d.rank)} where "
            f"each of theirs was {_said(d.want, None)} (a send or recv skipped, issued twice, or to the wrong "
            f"peer): rank {d.rank} departs, and the waits that follow come from it")


def _keeps_to(s: tuple, role: tuple) -> bool:
    """Whether a rank's calls are the role's as far as it went (or the role's as far as they go)."""
    return _common(s, role) == min(len(s), len(role))


def _common(a: list, b: list) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _said(token: tuple, rank: int | None) -> str:
    op, group, offset = token
    way = "to" if op == "send" else "from"
    if rank is not None:
        who = f"rank {rank + offset}"
    else:
        who = {1: "the next rank", -1: "the rank before"}.get(
            offset, f"the rank {abs(offset)} {'after' if offset > 0 else 'before'} it")
    return f"a {op} {way} {who} on group '{group}'"
