"""Point-to-point sends and receives that can never pair.

Sends and receives pair FIFO per (group, sender, receiver): the k-th send from s to r meets the k-th recv at r
from s. Two ways they never can:
- a cycle of p2p waits (both sides of a pair receive first, or a ring where everyone receives before sending):
  found by the wait-for graph (waitfor.py); every rank on it is in `ranks`.
- peers disagree on a pair that did meet: the k-th send and the k-th recv carry different sizes or dtypes
  (the receiver reads garbage or the transport aborts).
Both sides' claims are weighed: a rank waiting on a peer that never posted a single matching call, while other
ranks wait for that rank with exactly that call, chose the wrong peer: it alone is named. On a cycle, so is the
one rank that sends what nothing fed it, holds what it should have passed on, or waits for what its peer does
not owe it (p2p_flows.py: what a stage answers, whatever its schedule, asked first); else the one whose sends
and receives depart from the round it repeated before while every other rank on the cycle keeps its own (a call
issued twice, skipped, or to the wrong peer; `breaks_pattern`), unless its peer owes it the message it waits
for; or, before two whole rounds show, whose calls part from those of the ranks that play its role
(p2p_roles.py).
Flight Recorder over Gloo records no p2p at all, so these findings need the recorder's or simulator's traces.
"""

from __future__ import annotations

from collections import Counter

from distdoctor.findings.kinds import Finding, fmt_ranks, nth
from distdoctor.diagnose.p2p_flows import holds, opens_flow, owed, owed_departures, p2p_calls, unfed
from distdoctor.diagnose.p2p_roles import departure_text, lone_departure
from distdoctor.diagnose.waitfor import Cycle, numbered_pairs, p2p_entries
from distdoctor.findings.sentences import describe_cycle
from distdoctor.trace.model import TraceSet


def cycle_findings(cycles: list[Cycle], ts: TraceSet | None = None, waits_of: dict | None = None) -> list[Finding]:
    """A finding per cycle of p2p waits: every rank on it, unless both sides' claims, or each rank's own past
    calls, single out the one that deviates (`_deviating`)."""
    out = []
    for c in cycles:
        if not c.p2p_only:
            continue
        one = _deviating(c, ts, waits_of or {})
        if one is not None:
            out.append(one)
            continue
        first = c.path[0].why.entry
        both_recv = all(w.entry.op == "recv" for _, _, w in c.steps)
        why = "every rank on it receives before it sends" if both_recv else "each waits for a peer that waits on it"
        short = [(a, b, w) for a, b, w in c.steps if w.p2p is not None and 0 < w.p2p[1] <= w.p2p[0]]
        if short:  # the peer did post some: the two sides disagree on how many messages pass
            a, b, w = short[0]
            sent = "sent" if w.entry.op == "recv" else "received"
            why += (f"; rank {b} {sent} only {w.p2p[1]} message{'s' if w.p2p[1] != 1 else ''} "
                    f"{'to' if w.entry.op == 'recv' else 'from'} rank {a}, which waits for its {nth(w.p2p[0] + 1)} "
                    f"(pipeline stages configured with different numbers of micro-batches?)")
        out.append(Finding("p2p_deadlock", c.ranks, group=first.group, groups=c.groups, seq=first.p2p_seq,
                           op=first.op, t=first.t_created,
                           detail=f"{fmt_ranks(c.ranks)} can never pair their sends and receives: {why}. "
                                  f"Cycle: {describe_cycle(c.path)}.",
                           evidence={"cycle": [[a, b] for a, b, _ in c.steps]}))
    return out


def count_disagreements(cycles: list[Cycle], waits_of: dict) -> list[Finding]:
    """Cycles through a send or recv whose peer posted fewer matching calls and went on into a collective: the
    two sides disagree on how many messages pass between them (pipeline stages configured with different
    numbers of micro-batches, a rank-conditional send). Found before the cycle reads as an order deadlock."""
    out = []
    for c in cycles:
        if c.p2p_only:
            continue
        for a, b, w in c.steps:
            e = w.entry
            theirs = [v for v in waits_of.get(b, []) if not v.entry.is_p2p]
            if not e.is_p2p or w.p2p is None or w.p2p[1] > w.p2p[0] or not theirs:
                continue
            wanted, posted = w.p2p[0] + 1, w.p2p[1]
            other = "recv" if e.op == "send" else "send"
            moved = theirs[0].entry
            wrong = _wrong_peer(a, b, e, other, posted, waits_of, c.groups)
            if wrong is not None:
                out.append(wrong)
                break
            out.append(Finding(
                "p2p_deadlock", c.ranks, group=e.group, groups=c.groups, seq=e.p2p_seq, op=e.op, t=e.t_created,
                detail=(f"rank {a} waits in {e.op} #{e.p2p_seq} {'to' if e.op == 'send' else 'from'} rank {b} on "
                        f"group '{e.group}', its {nth(wanted)} {e.op} {'to' if e.op == 'send' else 'from'} rank {b}, "
                        f"but rank {b} posted only {posted} matching {other}{'s' if posted != 1 else ''} and went on "
                        f"to {moved.op} #{moved.seq} on group '{moved.group}': the two sides disagree on how many "
                        f"messages pass between them (pipeline stages configured with different numbers of "
                        f"micro-batches, a send or recv only some ranks make). Cycle: {describe_cycle(c.path)}."),
                evidence={"cycle": [[x, y] for x, y, _ in c.steps], "messages": {"expected": wanted, "posted": posted},
                          "deviating": b}))
            out[-1].ranks = _first(b, out[-1].ranks)  # b deviates (it stopped short and went on): it leads
            break
    return out


def _wrong_peer(a: int, b: int, e, other: str, posted: int, waits_of: dict, groups) -> Finding | None:
    """Both sides' claims weighed: rank a waits on b, b never posted a single matching call, and other ranks wait
    for a with that very call (they expect a's message, or to take one from a): a chose the wrong peer, not b."""
    if posted:
        return None
    expecting = sorted({r for r, ws in waits_of.items() if r not in (a, b) for v in ws
                        if v.entry.is_p2p and v.entry.op == other and v.entry.peer == a and v.entry.group == e.group})
    if not expecting:
        return None
    to = "to" if e.op == "send" else "from"
    return Finding(
        "p2p_deadlock", [a], group=e.group, groups=groups, seq=e.p2p_seq, op=e.op, t=e.t_created,
        detail=(f"rank {a} waits in {e.op} #{e.p2p_seq} {to} rank {b} on group '{e.group}', but rank {b} never "
                f"posted a single {other} {'from' if e.op == 'send' else 'to'} rank {a}, while {fmt_ranks(expecting)} "
                f"wait{'s' if len(expecting) == 1 else ''} in a {other} {'from' if e.op == 'send' else 'to'} rank "
                f"{a}: rank {a} chose the wrong peer (a stage's neighbour computed wrong?), not rank {b}."),
        evidence={"claims": {"rank": a, "peer": b, "expected_by": expecting}})


def _deviating(c: Cycle, ts: TraceSet | None, waits_of: dict) -> Finding | None:
    """The one rank of a p2p cycle the evidence singles out: it waits on a peer that never exchanged a single
    message with it in that group while others wait for it with that very call (`_wrong_peer`), or it alone
    departs from the pattern of sends and receives it repeated before while every other rank on the cycle
    keeps its own (`breaks_pattern`): a call issued twice, skipped, or to the wrong peer. None where nothing
    singles one out (a peer that did exchange with it may just not have reached its half yet; two ranks on the
    cycle that each wait on a stranger may either have chosen wrong)."""
    if ts is None:
        return None
    wrong = [f for a, b, w in c.steps
             if w.p2p is not None and w.p2p[1] == 0 and b in ts.ranks and not _exchanged(ts.ranks[b], a, w.entry.group)
             for f in [_wrong_peer(a, b, w.entry, "recv" if w.entry.op == "send" else "send", 0, waits_of, c.groups)]
             if f is not None]
    if len(wrong) == 1:  # two ranks each with a stranger for a peer: either may have chosen wrong
        return wrong[0]
    by_flows = _owes(c, ts)  # what a send answers, before how a rank's calls repeat: a phase's end is no deviation
    if by_flows is not None:
        return by_flows
    calls = {a: _calls_up_to(ts.ranks[a], w.entry) for a, _, w in c.steps if a in ts.ranks}
    judged = {a: breaks_pattern(tokens) for a, tokens in calls.items()}
    broke = [a for a, j in judged.items() if j is not None and j[0]
             and not any(x == a and w.entry.op == "recv" and owed(ts, w.entry.group, a, y, w.entry.p2p_seq)
                         for x, y, w in c.steps)]  # a call its peer owes it is no departure
    if len(broke) != 1 or len(judged) != len(c.ranks) or any(j is None for j in judged.values()):
        return _departs_from_role(c, ts)
    a = broke[0]
    e = next(w.entry for x, _, w in c.steps if x == a)
    period, issued, earlier = _departure(judged[a])
    others = [r for r in c.ranks if r != a]
    kept = f"rank {others[0]} keeps its own" if len(others) == 1 else f"{fmt_ranks(others)} keep theirs"
    return Finding(
        "p2p_deadlock", [a], group=e.group, groups=c.groups, seq=e.p2p_seq, op=e.op, t=e.t_created,
        detail=(f"rank {a} departs from the round of {period} sends and receives it repeated before: it issued "
                f"{issued} where, a round earlier, it issued {earlier} (a send or recv issued twice, skipped, or "
                f"to the wrong peer), while {kept}: rank {a} deviates, and the cycle of p2p waits follows from it. "
                f"Cycle: {describe_cycle(c.path)}."),
        evidence={"cycle": [[x, y] for x, y, _ in c.steps], "deviating": a, "period": period,
                  "issued": issued, "a_round_earlier": earlier})


def _departs_from_role(c: Cycle, ts: TraceSet) -> Finding | None:
    """The one rank of the cycle whose sends and receives part from those of the ranks of its role, where its
    own history is too short to show a round (p2p_roles.py)."""
    cache: dict = {}
    found = [d for a in c.ranks if a in ts.ranks for d in [lone_departure(ts, a, cache)] if d is not None]
    if len(found) != 1:
        return None
    d = found[0]
    e = next(w.entry for x, _, w in c.steps if x == d.rank)
    return Finding(
        "p2p_deadlock", [d.rank], group=e.group, groups=c.groups, seq=e.p2p_seq, op=e.op, t=e.t_created,
        detail=f"{departure_text(d)}. Cycle: {describe_cycle(c.path)}.",
        evidence={"cycle": [[x, y] for x, y, _ in c.steps], "deviating": d.rank, "role": d.role,
                  "departed_at": d.at + 1})


def _owes(c: Cycle, ts: TraceSet) -> Finding | None:
    """The one rank of the cycle that sends what nothing fed or waits for what nobody owes it (p2p_flows.py)."""
    found = owed_departures(ts, c.steps)
    if len({d.rank for d in found}) != 1:
        return None
    d = found[0]
    if any(x != d.rank and opens_flow(ts, w.entry.group, x) for x, _, w in c.steps):
        return None  # another rank on it sends where nothing fed it either: an order both may have swapped
    e = next(w.entry for x, _, w in c.steps if x == d.rank)
    return Finding(
        "p2p_deadlock", [d.rank], group=e.group, groups=c.groups, seq=e.p2p_seq, op=e.op, t=e.t_created,
        detail=f"{d.text}: rank {d.rank} deviates, and the cycle of p2p waits follows from it. "
               f"Cycle: {describe_cycle(c.path)}.",
        evidence={"cycle": [[x, y] for x, y, _ in c.steps], "deviating": d.rank, "owed": d.kind})


def _extra_call(ts: TraceSet, w, cache: dict) -> Finding | None:
    """A rank waiting in a send/recv its idle peer never posted is the one that deviates where its own calls
    depart from the round it repeated before while the peer's calls keep theirs (a call issued twice, or to
    the wrong peer): the peer did all its round asks of it, and this call is one too many."""
    a, b, e = w.rank, w.entry.peer, w.entry
    mine = breaks_pattern(_calls_up_to(ts.ranks[a], e))
    theirs = breaks_pattern([(x.op, x.group, x.peer) for x in p2p_entries(ts.ranks[b])])
    if mine is not None and mine[0] and e.op == "recv" and owed(ts, e.group, a, b, e.p2p_seq):
        mine = None  # the peer owes it this message: a phase that ends (1F1B's cool-down), not a departure
    if mine is None or theirs is None or not mine[0] or theirs[0]:
        d = lone_departure(ts, a, cache)
        if d is None or lone_departure(ts, b, cache) is not None:
            return _owes_more(ts, w)
        return Finding("p2p_deadlock", [a], group=e.group, seq=e.p2p_seq, op=e.op, t=e.t_created,
                       detail=(f"rank {a} waits in {e.op} #{e.p2p_seq} {'to' if e.op == 'send' else 'from'} rank "
                               f"{b} on group '{e.group}', which rank {b} never matches: {departure_text(d)}."),
                       evidence={"deviating": a, "peer": b, "role": d.role, "departed_at": d.at + 1})
    period, issued, earlier = _departure(mine)
    return Finding(
        "p2p_deadlock", [a], group=e.group, seq=e.p2p_seq, op=e.op, t=e.t_created,
        detail=(f"rank {a} waits in {e.op} #{e.p2p_seq} {'to' if e.op == 'send' else 'from'} rank {b} on group "
                f"'{e.group}', which rank {b} never matches: rank {a} departs from the round of {period} sends and "
                f"receives it repeated before (it issued {issued} where, a round earlier, it issued {earlier}), "
                f"while rank {b}'s calls keep their own round: rank {a}'s call is one too many (issued twice, or "
                f"to the wrong peer), not a call rank {b} owes."),
        evidence={"deviating": a, "peer": b, "period": period, "issued": issued, "a_round_earlier": earlier})


def _owes_more(ts: TraceSet, w) -> Finding | None:
    """A rank waiting in a send/recv its idle peer never posted, that sends what nothing fed it or holds what it
    should have passed on, or, where the peer ran its program to its end (it exited after
    destroy_process_group: it will neither receive nor send again), waits for what the peer does not owe it;
    where the peer holds nothing it owes (p2p_flows.py): its call is one too many, not one the peer owes. A
    peer merely idle may be stopped before the receive that would feed it, and one that exited with its process
    group alive may have left mid-way."""
    a, b, e = w.rank, w.entry.peer, w.entry
    reason = str(ts.ranks[b].dump_reason or "")
    found = owed_departures(ts, [(a, b, w)], peers_wait=False,
                            peers_ended=reason.startswith("exit:") and "destroy" in reason)
    theirs = p2p_calls(ts, b, e.group)
    if not found or theirs is None or holds(ts, e.group, b, theirs):
        return None
    d = found[0]
    return Finding("p2p_deadlock", [a], group=e.group, seq=e.p2p_seq, op=e.op, t=e.t_created,
                   detail=(f"rank {a} waits in {e.op} #{e.p2p_seq} {'to' if e.op == 'send' else 'from'} rank {b} on "
                           f"group '{e.group}', which rank {b} never matches: {d.text}."),
                   evidence={"deviating": a, "peer": b, "owed": d.kind})


def _unfed_send(ts: TraceSet, w) -> Finding | None:
    """A rank waiting in a send to a peer whose dump cannot show p2p, where its own calls show the send fed by
    nothing (p2p_flows.py, `unfed`): whatever the peer did, this send is one too many."""
    a, e = w.rank, w.entry
    mine = p2p_calls(ts, a, e.group)
    d = None if mine is None or e.op != "send" or mine.feeder(e.peer) is None else unfed(mine, a)
    if d is None or d.peer != e.peer:
        return None
    return Finding("p2p_deadlock", [a], group=e.group, seq=e.p2p_seq, op=e.op, t=e.t_created,
                   detail=(f"rank {a} waits in send #{e.p2p_seq} to rank {e.peer} on group '{e.group}', whose dump "
                           f"cannot show whether it posted the receive: {d.text}."),
                   evidence={"deviating": a, "peer": e.peer, "owed": d.kind})


def _exchanged(trace, peer: int, group: str) -> bool:
    """Whether the rank posted any send or recv with `peer` in `group`."""
    return any(e.peer == peer and e.group == group for e in p2p_entries(trace))


def _calls_up_to(trace, entry) -> list[tuple]:
    """The rank's sends and receives up to and including `entry` (the one it waits in), as (op, group, peer)."""
    out = []
    for e in p2p_entries(trace):
        out.append((e.op, e.group, e.peer))
        if e is entry:
            return out
    return out


WARM_UP = 8  # calls at the start that may differ from the rounds after them (a schedule's shape exchange)


def breaks_pattern(tokens: list[tuple]) -> tuple[bool, int, list, list] | None:
    """Whether a rank's last calls depart from the pattern it repeated before: the smallest period P with which
    its whole history before the last P calls repeats, but for a warm-up at the start (at most P or WARM_UP
    calls) and over at least two rounds, a round holding every call the rank makes to the peers it met before,
    its last ones included (a run of receives, or GPipe's forwards, one receive and one send to the next stage
    each, is one phase of a round, not a round: the backward phase that follows it is no departure; a call to
    a peer it never met is the departure itself); then (whether any of the last P calls differs from the one P
    earlier, P, those last calls, what the pattern had there). None where no period shows in the history (too
    short, or no pattern: a rank whose calls change from round to round is never judged by a local repeat)."""
    n = len(tokens)
    met: dict[tuple, int] = {}  # (group, peer) -> the index of the rank's first call with it
    for i, (_, group, peer) in enumerate(tokens):
        met.setdefault((group, peer), i)
    for period in range(1, n // 3 + 1):
        history = tokens[: n - period]
        kinds = {t for t in set(tokens) if met[t[1:]] < n - period}  # a call to a peer never met is the odd one
        i = len(history) - 1
        while i >= period and history[i] == history[i - period]:
            i -= 1
        repeated = len(history) - 1 - i + period  # the periodic suffix
        whole = set(history[len(history) - period:]) == kinds  # not one phase's repeat (GPipe's forwards)
        if whole and repeated >= 2 * period and len(history) - repeated <= max(period, WARM_UP):
            got, expected = tokens[n - period:], tokens[n - 2 * period: n - period]
            return got != expected, period, got, expected
    return None


def _departure(judged: tuple) -> tuple[int, str, str]:
    """(the period, the first call of the last round that departs from the round before, what that one had), in
    words, from what `breaks_pattern` found."""
    _, period, got, expected = judged
    j = next(i for i, (x, y) in enumerate(zip(got, expected)) if x != y)
    return period, _token(got[j]), _token(expected[j])


def _token(call: tuple) -> str:
    """A call in short: 'a send to rank 1'."""
    op, group, peer = call
    return f"a {op} {'to' if op == 'send' else 'from'} rank {peer} on group '{group}'"


def _first(rank: int, ranks: list[int]) -> list[int]:
    return [rank] + [r for r in ranks if r != rank]


def pair_disagreements(ts: TraceSet) -> list[Finding]:
    sends: dict[tuple, list] = {}
    recvs: dict[tuple, list] = {}
    for rank, trace in ts.ranks.items():
        for e in p2p_entries(trace):
            if e.op == "send" and e.peer is not None:
                sends.setdefault((e.group, rank, e.peer), []).append(e)
            elif e.op == "recv" and e.peer is not None:
                recvs.setdefault((e.group, e.peer, rank), []).append(e)
    out = []
    for key, ss in sends.items():
        rs = recvs.get(key, [])
        for s, r in _pairs(ts, key, ss, rs):
            if (s.in_sizes and r.out_sizes and s.in_sizes != r.out_sizes) or \
               (s.in_dtypes and r.out_dtypes and s.in_dtypes != r.out_dtypes):
                group, src, dst = key
                odd = _odd_side(s, ss, r, rs)
                if odd is not None:
                    out.append(_odd_side_finding(key, s, r, odd))
                    break
                out.append(Finding(
                    "p2p_deadlock", [src, dst], group=group, seq=s.p2p_seq, op="send", t=s.t_created,
                    detail=f"send #{s.p2p_seq} from rank {src} to rank {dst} carries {s.in_sizes} {s.in_dtypes} "
                           f"but the matching recv on rank {dst} expects {r.out_sizes} {r.out_dtypes}: the peers "
                           f"disagree, and one of {fmt_ranks([src, dst])} is wrong (two sides, no majority: the traces "
                           f"cannot tell which).",
                    evidence={"send": [src, s.index], "recv": [dst, r.index]}))
                break
    return out


def _pairs(ts: TraceSet, key: tuple, ss: list, rs: list) -> list[tuple]:
    """Each send with the recv it met: by the recorder's numbers where both sides' traces are the recorder's (a
    live state's tail, or a wrapped ring's, keeps only the last calls: the k-th of each list need not meet), else
    the k-th with the k-th (waitfor.py, `_partner`)."""
    _, src, dst = key
    if not numbered_pairs(ts, src, dst):
        return list(zip(ss, rs))
    by_number = {r.p2p_seq: r for r in rs if r.p2p_seq is not None}
    return [(s, by_number[s.p2p_seq]) for s in ss if s.p2p_seq in by_number]


def message_of(e) -> tuple:
    """What a send passes or a recv posts for: sizes and dtypes (reprs, to count and compare)."""
    return (repr(e.in_sizes), repr(e.in_dtypes)) if e.op == "send" else (repr(e.out_sizes), repr(e.out_dtypes))


def _usual(e, calls: list) -> bool | None:
    """Whether `e` carries the message most of the other `calls` carry (at least two of them): True; False where
    no other one carries its message; None where neither holds (the first calls may differ: a schedule's
    exchange of shapes)."""
    others = Counter(message_of(x) for x in calls if x is not e)
    if not others:
        return None
    usual, n = others.most_common(1)[0]
    if n < 2:
        return None
    return True if message_of(e) == usual else (False if message_of(e) not in others else None)


def _odd_side(s, sends: list, r, recvs: list) -> str | None:
    """Both sides of a pair that disagrees weighed by their own calls on that pair: 'send' where the send alone
    departs from what its sender passes every other time, 'recv' where the recv alone does; None where both or
    neither do, or the history cannot say."""
    send_usual, recv_usual = _usual(s, sends), _usual(r, recvs)
    if send_usual is False and recv_usual is True:
        return "send"
    if recv_usual is False and send_usual is True:
        return "recv"
    return None


def _odd_side_finding(key: tuple, s, r, odd: str) -> Finding:
    group, src, dst = key
    rank, e, other = (src, s, r) if odd == "send" else (dst, r, s)
    kind = "dtype_mismatch" if e.in_dtypes != other.out_dtypes and odd == "send" or \
        odd == "recv" and e.out_dtypes != other.in_dtypes else "size_mismatch"
    return Finding(
        kind, [rank], group=group, seq=e.p2p_seq, op=e.op, t=e.t_created,
        detail=(f"send #{s.p2p_seq} from rank {src} to rank {dst} carries {s.in_sizes} {s.in_dtypes} but the "
                f"matching recv on rank {dst} expects {r.out_sizes} {r.out_dtypes}: rank {rank}'s {e.op} is the odd "
                f"one, a message none of its other {e.op}s {'to' if odd == 'send' else 'from'} rank "
                f"{dst if odd == 'send' else src} carried, where rank {dst if odd == 'send' else src}'s "
                f"{other.op} is the one it posts every time."),
        evidence={"send": [src, s.index], "recv": [dst, r.index], "odd": odd})


def unposted_peers(ts: TraceSet, waits, pending: dict, on_cycle: set[int]) -> list[Finding]:
    """Ranks blocked in a send/recv whose peer never posted the other half and waits for nobody (stuck in
    compute, a data loader, a buffer it cannot get): the p2p form of `missing_ranks`, one finding per group;
    `ranks` are the idle peers. A peer whose dump cannot show p2p (Gloo's Flight Recorder) is not idle for all
    anyone knows: the explainer weighs it (explain.py, `unknown_p2p`)."""
    from distdoctor.diagnose.progress import describe_rank

    from distdoctor.diagnose.progress import shows_no_p2p

    by_group: dict[str, list] = {}
    out_blind: list[Finding] = []
    waiting = {w.rank for w in waits}
    for w in waits:
        e = w.entry
        if not e.is_p2p or e.peer is None or e.peer not in ts.ranks or w.rank in on_cycle:
            continue
        if shows_no_p2p(ts.ranks[e.peer]):  # its dump cannot show the matching half: unknown (explain.py), but
            own = _unfed_send(ts, w)  # for a send the rank's own calls show nothing fed
            out_blind.extend([own] if own is not None else [])
            continue
        if e.peer in waiting:  # the peer waits for others in something else: that is where the story goes on
            continue
        by_group.setdefault(e.group, []).append(w)
    out = out_blind
    for group, ws in sorted(by_group.items()):
        ws.sort(key=lambda w: w.rank)
        cache: dict = {}  # each rank's calls read relative to it, once for every waiter (p2p_roles.py)
        extra = [f for f in (_extra_call(ts, w, cache) for w in ws) if f is not None]
        out += extra
        ws = [w for w in ws if w.rank not in {f.ranks[0] for f in extra}]
        if not ws:
            continue
        idle = sorted({w.entry.peer for w in ws})
        first = ws[0].entry
        other = {"send": "recv", "recv": "send"}
        waiting = "; ".join(f"rank {w.rank} waits in {w.entry.op} #{w.entry.p2p_seq} "
                            f"{'to' if w.entry.op == 'send' else 'from'} rank {w.entry.peer}" for w in ws[:8])
        more = f" (and {len(ws) - 8} more)" if len(ws) > 8 else ""
        detail = (f"{waiting}{more} on group '{group}', but {fmt_ranks(idle)} never posted the matching "
                  f"{other.get(first.op, 'half')}. "
                  + "; ".join(describe_rank(r, ts.ranks.get(r), pending.get(r, [])) for r in idle[:8])
                  + ".")
        out.append(Finding("missing_ranks", idle, group=group, seq=first.p2p_seq, op=first.op, t=first.t_created,
                           detail=detail, evidence={"waiting": [[w.rank, w.entry.peer] for w in ws]}))
    return out
