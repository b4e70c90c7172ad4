"""Plain-text report of `distdoctor diagnose`: the verdict first, then each finding in a sentence or two with its
evidence, then where each rank is, then the files that could not be used."""

from __future__ import annotations

from distdoctor.diagnose import hang_status
from distdoctor.diagnose.analyze import Report
from distdoctor.diagnose.progress import is_gloo_fr
from distdoctor.findings.kinds import fmt_group, fmt_ranks, numbered
from distdoctor.report.diagnose_threads import thread_lines
from distdoctor.report.findings import MAX_LISTED, finding_lines, fmt_ranges

MAX_RANK_LINES = 32
MAX_CONSEQUENCE_LINES = 8
MAX_GIST_LINES = 16


def merged_note(traces: list) -> str:
    """One line on the ranks whose recorder trace and Flight Recorder dump were merged (and on ranks with only a
    recorder trace whose sequence numbers were translated through a merged rank's)."""
    merged = [t for t in traces if "flight_recorder_only" in t.merged]
    renumbered = [t for t in traces if "renumbered_through" in t.merged]
    parts = []
    if merged:
        only_fr = sum(t.merged["flight_recorder_only"] for t in merged)
        parts.append(f"{fmt_ranks([t.rank for t in merged])}: the recorder's trace and Flight Recorder's dump merged "
                     f"into one view" + (f" ({only_fr} call(s) only Flight Recorder saw: issued from C++, e.g. DDP's "
                                         f"gradient buckets)" if only_fr else ""))
    through = [t for t in renumbered if t.merged["renumbered_through"]]
    if through:
        via = sorted({r for t in through for r in t.merged["renumbered_through"].values()})
        parts.append(f"{fmt_ranks([t.rank for t in renumbered])} left no Flight Recorder dump: sequence numbers "
                     f"translated through {fmt_ranks(via)}'s; the calls C++ issued are missing from their view")
    placed = [t for t in renumbered if t.merged.get("placed_among_flight_recorder")]
    if placed:
        unseen = max(sum(g["unseen"] for g in t.merged["placed_among_flight_recorder"].values()) for t in placed)
        parts.append(f"{fmt_ranks([t.rank for t in placed])} left only the recorder's trace: their calls were placed "
                     f"among the Flight Recorder ranks' by the calls they share"
                     + (f"; {unseen} call(s) the recorder cannot see (issued from C++) are unknown for them, "
                        f"neither present nor absent" if unseen else ""))
    return "; ".join(parts)


def render_text(report: Report) -> str:
    ts = report.traces
    lines = []
    n_find = len(report.findings)
    n_bad = len(ts.errors)
    head = {"problem": "PROBLEM", "in_flight": "IN FLIGHT", "undecided": "UNDECIDED"}.get(report.verdict, "OK")
    lines.append(f"verdict: {head} - {n_find} finding{'s' if n_find != 1 else ''}; world size {report.world_size}, "
                 f"{len(ts.ranks)} trace{'s' if len(ts.ranks) != 1 else ''} loaded"
                 + (f", {n_bad} file{'s' if n_bad != 1 else ''} unusable" if n_bad else ""))
    lines.extend(hang_status.text_lines(report))
    if report.verdict == "ok":
        lines.append("No desync, hang or straggler found in these traces.")
        if any(is_gloo_fr(t) for t in ts.ranks.values()):
            lines.append("(Gloo's Flight Recorder records no send/recv: a rank blocked in p2p, a pipeline stage, "
                         "looks finished in these dumps; the distdoctor recorder's traces show it.)")
    elif report.verdict == "undecided":
        lines.append(f"No verdict: {report.undecided}")
    elif report.verdict == "in_flight":
        lines.append(f"No desync found, but {fmt_ranks(report.in_flight_ranks())} run collectives every member "
                     "reached (their GPUs, under NCCL): nothing in these dumps holds them up, nor shows them end. A "
                     "dump taken while the job ran looks so; if the job hangs, it hangs inside those calls (the "
                     "transport or a device): collective timing (TORCH_NCCL_ENABLE_TIMING=1) shows whether they "
                     "started.")
    lines.extend(finding_lines(report.findings))
    if report.consequences and report.findings:  # each points at a finding: never "of the above" with none above
        lines.append("")
        lines.append(f"consequences of the findings above ({len(report.consequences)}; all in --format json, "
                     f"'consequences'):")
        for c in report.consequences[:MAX_CONSEQUENCE_LINES]:
            lines.append("  " + _consequence_line(c))
        if len(report.consequences) > MAX_CONSEQUENCE_LINES:
            lines.append(f"  ... {len(report.consequences) - MAX_CONSEQUENCE_LINES} more")
    lines.append("")
    lines.append("where each rank is:")
    # In a big world the ranks the findings name come first: rank 0..31 are rarely the story.
    named: dict[str, int] = {}  # rank -> the first finding that names it: the root cause's ranks lead
    for k, f in enumerate(report.findings):
        for r in f.ranks[:MAX_RANK_LINES]:
            named.setdefault(str(r), k)
    order = sorted(report.ranks, key=lambda r: (named.get(r, len(named) + 1), int(r))) \
        if len(report.ranks) > MAX_RANK_LINES else list(report.ranks)
    for i, rank in enumerate(order):
        if i == MAX_RANK_LINES:
            lines.append(f"  ... {len(report.ranks) - MAX_RANK_LINES} more ranks (see --format json); "
                         f"all {len(report.ranks)} by where they are:")
            lines.extend(_gist_lines(report.ranks))
            break
        lines.append("  " + _rank_line(rank, report.ranks[rank]))
    lines.extend(thread_lines(report))  # ranks read from per-rank logs: each thread's position
    if ts.errors:
        lines.append("")
        lines.append("files not used:")
        lines.extend(f"  {e.path}: {e.reason}" for e in ts.errors)
    merged = [t for t in ts.ranks.values() if t.merged]
    if merged:
        lines.append("")
        lines.append(merged_note(merged) + ".")
    if ts.refuted:
        lines.append("")
        lines.append(refuted_note(ts.refuted))
    for f in report.unconfirmed:
        lines.append("")
        lines.append(f"not a finding: rank {f.ranks[0]} may be a straggler: {f.detail}")
    if ts.launch is not None:
        lines.append("")
        lines.append(launch_note(ts.launch.to_json()))
    return "\n".join(lines) + "\n"


LAUNCH_HOW = {"exception": "raised", "unshown": "exited with code 1 (no traceback in the log)",
              "stopped": "stopped by the launcher", "unknown": "ended"}  # (a signal and an exit name theirs)


def launch_note(launch: dict) -> str:
    """One line on the launcher's account (trace/loaders/launcher_log.py): how it says each rank ended."""
    by_how: dict[str, list[int]] = {}
    for rank, ended in launch["ranks"].items():
        how = LAUNCH_HOW.get(ended["ended"], ended["ended"])
        if ended["ended"] == "signal":
            how = f"ended by {ended['signal']}, which the launcher did not send"
        elif ended["ended"] == "exit":
            how = f"exited with code {ended['exitcode']}"
        by_how.setdefault(how, []).append(int(rank))
    said = "; ".join(f"rank{'s' if len(ranks) > 1 else ''} {fmt_ranges(sorted(ranks))} {how}" for how, ranks in
                     sorted(by_how.items(), key=lambda kv: (kv[0] == LAUNCH_HOW["stopped"], min(kv[1]))))
    stop = "the job was stopped from outside (the launcher was signalled); " if launch["told_to_stop"] else ""
    return f"the launcher's log ({launch['path']}): {stop}{said or 'no rank named'}."


def _waiting_in(x: dict) -> str:
    where = x.get("member_waits_in")
    return f", itself waiting in #{where['seq']} on group '{where['group']}'," if where else ""


def refuted_note(refuted: list[dict]) -> str:
    """One line on the calls a Flight Recorder dump marks retired that a held member (its process ended, or it
    waited in a call that could not complete) never issued (trace/loaders/completion.py)."""
    calls = "; ".join(f"rank {x['rank']}'s #{x['seq']} on group '{x['group']}' (rank {x['never_issued_by']}"
                      f"{_waiting_in(x)} never issued it)" for x in refuted)
    return (f"Read as in flight, not completed: {calls}. Gloo's Flight Recorder retires a call that failed as it "
            "does one that completed, and no call completes without every member.")


def _gist(p: dict) -> str:
    """What a rank's line says, without its own group names (which differ across a mesh's ranks)."""
    if p.get("missing"):
        return "no trace"
    done = sum(p.get("completed", {}).values())
    s = f"{done} collectives completed" if done else "no collective completed"
    pending = p.get("pending")
    s += f"; blocked in {numbered(pending[0]['op'], pending[0]['seq'])}" if pending else "; in no collective"
    return s + (f" [{p['state']}]" if p.get("state") else "")


def _gist_lines(ranks: dict[str, dict]) -> list[str]:
    """Every rank, ranks whose lines say the same thing collapsed into ranges, most common first."""
    by_gist: dict[str, list[int]] = {}
    for rank, p in ranks.items():
        by_gist.setdefault(_gist(p), []).append(int(rank))
    kinds = sorted(by_gist.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    out = [f"    {'rank' if len(rs) == 1 else 'ranks'} {fmt_ranges(rs)}"
           + (f" ({len(rs)} ranks)" if len(rs) > 1 else "") + f": {gist}" for gist, rs in kinds[:MAX_GIST_LINES]]
    if len(kinds) > MAX_GIST_LINES:
        rest = sum(len(rs) for _, rs in kinds[MAX_GIST_LINES:])
        out.append(f"    ... {len(kinds) - MAX_GIST_LINES} more kinds of line ({rest} ranks)")
    return out


def _consequence_line(c: dict) -> str:
    ranks = c["ranks"]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}" \
        if len(ranks) <= MAX_LISTED else f"ranks {fmt_ranges(ranks)} ({len(ranks)} ranks)"
    seq = f" #{c['seq']}" if c.get("seq") is not None else ""
    if c.get("op") is None:
        return f"{who}: {c['kind']}, {c['because']} (finding {c['finding'] + 1})"
    what = "blocked in" if c["kind"] == "blocked" else f"{c['kind']} at"
    return f"{who}: {what} {c['op']}{seq} on {fmt_group(c['group'])}, {c['because']} (finding {c['finding'] + 1})"


def _rank_line(rank: str, p: dict) -> str:
    if p.get("missing"):
        return f"rank {rank}: no trace"
    if "log" in p and not p["entries"]:  # a per-rank log without collective calls: its threads are listed below
        return f"rank {rank}: {p['log']['lines']} log lines, no collective call logged; {len(p['threads'])} threads"
    done = sum(p["completed"].values())
    per = ", ".join(f"'{g}': {n}" for g, n in sorted(p["completed"].items()))
    s = f"rank {rank}: {done} collectives completed ({per})" if done else f"rank {rank}: no collective completed"
    if "steps" in p:
        s += f", {p['steps']} steps of {p['collectives_per_step']}"
    if p.get("state") == "crashed":  # never "in no collective; now at ...": it is not running
        return s + f"; {p['state_detail']}"
    if p["pending"]:
        e = p["pending"][0]
        s += f"; blocked in {numbered(e['op'], e['seq'])} on '{e['group']}'"
        if "waiting_s" in e:
            s += f" for {e['waiting_s']:.1f} s"
        if e.get("called_from"):
            s += f", called from {e['called_from']}"
    else:
        s += "; in no collective"
    if p.get("now"):
        s += f"; now at {p['now']}"
    state = p.get("state")
    if state in ("waiting_on_idle", "waiting_on_active", "waiting_on_lost", "outside_collectives",
                 "stuck_in_collective"):
        s += f" [{state}: {p['state_detail'].split(', ', 1)[-1] if state.startswith('waiting') else p['state_detail'].split('; ', 1)[-1]}]"
    elif state:
        s += f" [{state}]"
    return s
