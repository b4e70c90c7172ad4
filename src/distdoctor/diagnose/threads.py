"""Per-thread progress from per-rank logs: where each thread stands, and which threads differ from their peers.

The question an engineer answers by hand from `before:`/`after:` logs (trace/loaders/logs.py): on each rank, on each
thread (stream), what was the last op finished and which op was begun and never finished? Then: which of those
stuck threads tell the ranks apart?

Ops are compared across ranks by name and run: a thread inside the n-th run of op X is compared with the ranks
whose logs also run X (its peers: the same pipeline stage, the same tensor-parallel shard...). Threads carry OS
thread ids, which differ between ranks, so only ops are compared. Each open op falls in the first of:
1. `peers_finished`: some peer finished run n of X: this rank is behind its peers, stuck where they got through;
2. `peers_behind`: every peer that got as far is inside it too, and some peers ran X before but never began run n:
   they are behind (an op that needs all of them, a collective or a send/recv pair, waits for them);
3. `only_these_ranks`: the ranks that run X are all inside run n: stuck together (waiting on something outside X:
   another stage, a buffer, the device), and the ranks that do not run X are not;
4. `every_rank`: every rank with a log is inside run n of X: nothing tells the ranks apart (a source op waiting for
   the next batch is normally open like this), so it is a finding only when nothing else is found.
A thread with no open op is stuck between ops; when no thread is stuck in one of the ways 1-3, such a thread is
5. `idle_behind` when its peers finished more runs of the op it finished last: it stopped before them, in code its
   markers do not cover (a data loader, a host sync) or waiting for something they did not wait for.
One `stuck_thread` finding per (class, op, run), strongest first, naming the rank, thread and file:line of each.

How far behind: a rank's lag is, summed over the ops it runs, how many more runs the most advanced rank finished.
The report lists threads of stuck ranks first, then by lag, so the ranks whose progress differs come first.
"""

from __future__ import annotations

from distdoctor.findings.kinds import Finding, fmt_ranks
from distdoctor.trace.model import RankLog, ThreadState, TraceSet

WHY = ("peers_finished", "peers_behind", "only_these_ranks", "idle_behind", "every_rank")
MAX_THREADS_NAMED = 8  # per finding, in its detail (the evidence lists all)


def thread_findings(ts: TraceSet, others_found: bool) -> tuple[list[Finding], dict[int, dict]]:
    """stuck_thread findings in order of strength (`every_rank` ones only when nothing else is found), and what
    each rank's `ranks[r]` JSON gains: its threads and its log's facts."""
    logs = {r: t.log for r, t in ts.ranks.items() if t.log is not None}
    if not logs:
        return [], {}
    opens = [(r, thread, st) for r, log in logs.items() for thread, st in log.threads.items() if st.open_op]
    wanted = {st.open_op for _, _, st in opens}
    runs_of: dict[str, dict[int, tuple]] = {op: {} for op in wanted}  # op -> rank -> (runs, done, thread)
    most_done: dict[str, int] = {}
    for r, log in logs.items():
        for op, counts in log.ops.items():
            if op in wanted:
                runs_of[op][r] = counts
            if counts[1] > most_done.get(op, -1):
                most_done[op] = counts[1]
    lag = {r: sum(most_done[op] - c[1] for op, c in log.ops.items()) for r, log in logs.items()}

    groups: dict[tuple[int, str, int], dict] = {}
    ahead: dict[tuple[str, int], tuple[set[int], set[int]]] = {}  # (op, run) -> (finished it, never began it)
    for r, thread, st in opens:
        op, n = st.open_op, st.run
        got = ahead.get((op, n))
        if got is None:  # once per (op, run): a thousand ranks inside the same op share it
            got = ahead[(op, n)] = ({q for q, c in runs_of[op].items() if c[1] >= n},
                                    {q for q, c in runs_of[op].items() if c[0] < n})
        finished, behind = got
        if finished - {r}:
            why = "peers_finished"
        elif behind - {r}:
            why = "peers_behind"
        elif len(runs_of[op]) == len(logs):
            why = "every_rank"
        else:
            why = "only_these_ranks"
        g = groups.setdefault((WHY.index(why), op, n), {"why": why, "threads": [], "finished": finished,
                                                        "behind": behind})
        g["threads"].append((r, thread, st))
    if not any(k[0] < WHY.index("idle_behind") for k in groups):
        _idle_behind(logs, most_done, groups, runs_of)
    order = sorted(groups, key=lambda k: (k[0], -len({r for r, _, _ in groups[k]["threads"]}), k[1], k[2]))
    findings = [_finding(groups[k], k[1], k[2], logs, len(runs_of[k[1]])) for k in order]
    strong = [f for f in findings if f.evidence["why"] != "every_rank"]
    if strong or others_found:
        findings = strong
    return findings, {r: _rank_json(log, lag[r]) for r, log in logs.items()}


def _idle_behind(logs: dict[int, RankLog], most_done: dict[str, int], groups: dict, runs_of: dict) -> None:
    """Threads with nothing open whose peers finished more runs of the op they finished last (class 5)."""
    for r, log in logs.items():
        for thread, st in log.threads.items():
            if st.open_op or not st.last_done:
                continue
            op = st.last_done
            done = log.ops[op][1]
            if most_done[op] <= done:
                continue
            if op not in runs_of:
                runs_of[op] = {q: other.ops[op] for q, other in logs.items() if op in other.ops}
            g = groups.setdefault((WHY.index("idle_behind"), op, done + 1), {
                "why": "idle_behind", "threads": [], "behind": set(),
                "finished": {q for q, c in runs_of[op].items() if c[1] > done}})
            g["threads"].append((r, thread, st))


def _finding(g: dict, op: str, run: int, logs: dict[int, RankLog], n_running: int) -> Finding:
    why, threads = g["why"], sorted(g["threads"], key=lambda x: (x[0], x[1]))
    ranks = sorted({r for r, _, _ in threads})
    g["finished"], g["behind"] = g["finished"] - set(ranks), g["behind"] - set(ranks)
    who = fmt_ranks(ranks)
    one = len(ranks) == 1
    if why == "peers_finished":
        fin = sorted(g["finished"])
        head = (f"{who} began {op} (run {run}) and never finished it, while {fmt_ranks(fin)} finished that run: "
                f"{'it is' if one else 'they are'} behind {'its' if one else 'their'} peers.")
    elif why == "peers_behind":
        late = sorted(g["behind"])
        head = (f"{who} {'is' if one else 'are'} inside {op} (run {run}) and never finished it; {fmt_ranks(late)} ran "
                f"{op} before but never began run {run}: {'it is' if len(late) == 1 else 'they are'} behind, and if "
                f"the op needs all of them (a collective, a send/recv pair) it waits for "
                f"{'it' if len(late) == 1 else 'them'}. Where they are: "
                + "; ".join(_position(q, logs[q], logs[q].ops[op][2]) for q in late[:4]) + ".")
    elif why == "idle_behind":
        head = (f"{who} finished run {run - 1} of {op} and began nothing since on "
                f"{'that thread' if one else 'those threads'}, while {fmt_ranks(sorted(g['finished']))} finished run "
                f"{run}: {'it' if one else 'they'} stopped before "
                f"{'its' if one else 'their'} peers, in code the markers do not cover (a data loader, a host sync) or "
                f"waiting for something the others did not wait for.")
    elif why == "only_these_ranks":
        head = (f"{who} {'is' if one else 'are'} inside {op} (run {run}), begun and never finished; "
                + ("no other rank runs it" if n_running == len(ranks) else
                   f"the {n_running - len(ranks)} other rank(s) that run it are inside it too, under another op")
                + f", and {len(logs) - len(ranks)} other rank(s) with a log are not stuck in it.")
    else:
        head = (f"every rank with a log is inside {op} (run {run}): nothing in the logs tells the ranks apart (a "
                f"source op waiting for the next batch is normally open like this).")
    named = "; ".join(_position(r, logs[r], t) for r, t, _ in threads[:MAX_THREADS_NAMED])
    more = f"; and {len(threads) - MAX_THREADS_NAMED} more threads" if len(threads) > MAX_THREADS_NAMED else ""
    evidence = {"why": why, "run": run,
                "threads": [{"rank": r, "thread": t, "line": st.line if why != "idle_behind" else st.last_done_line,
                             "open_for_s": st.open_for_s, "last_done": st.last_done} for r, t, st in threads]}
    if g["finished"]:
        evidence["finished_by"] = sorted(g["finished"])
    if g["behind"]:
        evidence["not_begun_by"] = sorted(g["behind"])
    return Finding("stuck_thread", ranks, op=op, detail=f"{head} {named}{more}.", evidence=evidence)


def _position(rank: int, log: RankLog, thread: str) -> str:
    """'rank 1 thread 2726830 inside X since f:412 (55.0 s before the log ends), after Y' or '... idle after Y'."""
    st = log.threads.get(thread)
    if st is None:
        return f"rank {rank} thread {thread}: no marker"
    s = f"rank {rank} thread {thread} "
    if st.open_op:
        s += f"inside {st.open_op} since {st.line}"
        if st.open_for_s is not None:
            s += f" ({st.open_for_s:.1f} s before the log ends)"
        return s + (f", after {st.last_done}" if st.last_done else ", nothing finished before")
    return s + (f"idle after {st.last_done} ({st.last_done_line})" if st.last_done else "idle, nothing finished")


def thread_json(st: ThreadState) -> dict:
    out = {"open_op": st.open_op, "last_done": st.last_done, "line": st.line, "run": st.run,
           "open_for_s": st.open_for_s, "last_done_line": st.last_done_line, "done": st.done}
    if st.also_open:
        out["also_open"] = [{"op": op, "line": line} for op, line in st.also_open]
    if st.unclosed:
        out["unclosed"] = st.unclosed
    if st.unmatched_ends:
        out["unmatched_ends"] = st.unmatched_ends
    return out


def _rank_json(log: RankLog, lag: int) -> dict:
    out = {"threads": {t: thread_json(st) for t, st in sorted(log.threads.items())},
           "log": {"path": log.path, "lines": log.lines, "skipped_lines": log.skipped, "skipped_at": log.skipped_at,
                   "behind_peers": lag}}
    if log.nccl_last:
        out["log"]["nccl"] = log.nccl_last
    return out


def ordered_threads(ranks: dict[str, dict], findings: list[Finding]) -> list[tuple[str, str, dict]]:
    """(rank, thread, thread JSON) with the threads the findings name first (in finding order), then the other
    threads of the ranks furthest behind their peers, then the rest."""
    first: dict[tuple[str, str], int] = {}
    for i, f in enumerate(findings):
        for t in f.evidence.get("threads", ()) if f.kind == "stuck_thread" else ():
            first.setdefault((str(t["rank"]), t["thread"]), i)
    rows = [(r, t, st) for r, p in ranks.items() for t, st in p.get("threads", {}).items()]
    return sorted(rows, key=lambda x: (first.get((x[0], x[1]), len(findings)), -ranks[x[0]]["log"]["behind_peers"],
                                       int(x[0]), x[2]["open_op"] is None, x[1]))


__all__ = ["thread_findings", "ordered_threads", "thread_json", "WHY"]
