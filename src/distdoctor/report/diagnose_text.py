"""Plain-text report of `distdoctor diagnose`: the verdict first, then each finding in a sentence or two with its
evidence, then where each rank is, then the files that could not be used."""

from __future__ import annotations

from distdoctor.diagnose import hang_status
from distdoctor.diagnose.analyze import Report
from distdoctor.diagnose.command import merged_note
from distdoctor.diagnose.findings import fmt_group
from distdoctor.report.diagnose_threads import thread_lines

MAX_RANK_LINES = 32
MAX_CONSEQUENCE_LINES = 8


def render_text(report: Report) -> str:
    ts = report.traces
    lines = []
    n_find = len(report.findings)
    n_bad = len(ts.errors)
    head = "PROBLEM" if report.verdict == "problem" else "OK"
    lines.append(f"verdict: {head} - {n_find} finding{'s' if n_find != 1 else ''}; world size {report.world_size}, "
                 f"{len(ts.ranks)} trace{'s' if len(ts.ranks) != 1 else ''} loaded"
                 + (f", {n_bad} file{'s' if n_bad != 1 else ''} unusable" if n_bad else ""))
    lines.extend(hang_status.text_lines(report))
    if report.verdict == "ok":
        lines.append("No desync, hang or straggler found in these traces.")
    for i, f in enumerate(report.findings, 1):
        lines.append("")
        lines.extend(finding_lines(i, f))
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
    named = {str(r) for f in report.findings for r in f.ranks[:MAX_RANK_LINES]}
    order = sorted(report.ranks, key=lambda r: (r not in named, int(r))) if len(report.ranks) > MAX_RANK_LINES \
        else list(report.ranks)
    for i, rank in enumerate(order):
        if i == MAX_RANK_LINES:
            lines.append(f"  ... {len(report.ranks) - MAX_RANK_LINES} more ranks (see --format json)")
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
    return "\n".join(lines) + "\n"


def finding_lines(i: int, f) -> list[str]:
    """One finding (diagnose's, or a lint hazard as a Finding): its kind, ranks and call, then its sentence."""
    where = ""
    if f.op is not None:
        where = f" at {f.op}" + (f" #{f.seq}" if f.seq is not None else "") + \
            (f" on {fmt_group(f.group)}" if f.group is not None or f.kind != "stuck_thread" else "")
    elif len(f.groups) > 1 or (f.groups and f.group is None):
        where = " on groups " + ", ".join(repr(g) for g in f.groups)
    return [f"{i}. {f.kind}: ranks {f.ranks}{where}", f"   {f.detail}"]


def _consequence_line(c: dict) -> str:
    ranks = c["ranks"]
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks[:8])) + \
        (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")
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
        s += f"; blocked in {e['op']} #{e['seq']} on '{e['group']}'"
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
