"""rank_conditional_collective: the n-th collective of a group is issued from different code on different ranks.

The sequence numbers agree and the run completed, but only because two code paths happen to issue the same
number of compatible calls (`if rank == 0: log_metrics(loss) else: sync(loss)`): a change to either path, a
different number of steps on one rank, or another data size, and the group desyncs or hangs. Needs call sites,
so traces with frames: the recorder's, Flight Recorder pickles with stack frames (not Gloo's JSON dumps, not
calls issued from C++ such as DDP's gradient buckets). Only the user's own innermost three frames are compared (hazard.user_frames:
torch's internals differ by rank legitimately, e.g. a checkpoint coordinator). One hazard per group and pair of
code paths, however many sequence numbers repeat it (a loop), with the count.
"""

from __future__ import annotations

from distdoctor.findings.kinds import fmt_group, fmt_ranks
from distdoctor.lint.hazard import Hazard, site_of, user_frames
from distdoctor.trace.model import TraceSet
from distdoctor.trace.summary import summarize


def _framed_ranks(ts: TraceSet) -> list[int]:
    # A simulated trace's frames are plan positions per rank (plan.yaml:rank0/stream), not code shared by ranks.
    return [r for r, t in sorted(ts.ranks.items()) if t.source != "simulated" and any(t.column("frames"))]


def find(ts: TraceSet) -> list[Hazard]:
    ranks = _framed_ranks(ts)
    if len(ranks) < 2:
        return []
    # group -> seq -> code path -> ranks
    paths: dict[str, dict[int, dict[tuple, list[int]]]] = {}
    for r in ranks:
        trace = ts.ranks[r]
        for name, seqs in summarize(trace).by_group.items():
            per_seq = paths.setdefault(name, {})
            for seq, pos in seqs.items():
                e = trace.entries[pos]
                chain = tuple((f.filename, f.line) for f in user_frames(e))
                if chain:
                    per_seq.setdefault(seq, {}).setdefault(chain, []).append(r)
    found: dict[tuple, dict] = {}  # (group, the parting) -> first seq, count
    for name, per_seq in paths.items():
        for seq in sorted(per_seq):
            by_path = per_seq[seq]
            if len(by_path) < 2:
                continue
            parting = (name, tuple(sorted((p, tuple(rs)) for p, rs in by_path.items())))
            got = found.setdefault(parting, {"seq": seq, "count": 0})
            got["count"] += 1
    return [_hazard(ts, name, dict(parting), got) for (name, parting), got in
            sorted(found.items(), key=lambda kv: (kv[1]["seq"], kv[0][0]))]


def _hazard(ts: TraceSet, name: str, parting: dict[tuple, tuple], got: dict) -> Hazard:
    seq, count = got["seq"], got["count"]
    classes = sorted(parting.items(), key=lambda kv: (-len(kv[1]), kv[1]))
    desc = next((t.groups[name].desc for t in ts.ranks.values() if name in t.groups and t.groups[name].desc), None)
    op = None
    h = Hazard("rank_conditional_collective", [r for _, rs in classes for r in rs], [name], "")
    for path, rs in classes:
        trace = ts.ranks[rs[0]]
        e = trace.entries[summarize(trace).by_group[name][seq]]
        op = op or e.op
        h.add_site(list(rs), f"called {e.op} #{seq} from", site_of(e))
    where = " and ".join(f"{fmt_ranks(rs)} from {path[0][0].rsplit('/', 1)[-1]}:{path[0][1]}" for path, rs in classes)
    again = f" (and the same parting at {count - 1} later call(s))" if count > 1 else ""
    h.detail = (f"{op} #{seq} on {fmt_group(name, desc)} is issued from different code on different ranks ({where})"
                f"{again}: the calls line up today only because both paths happen to issue matching collectives; "
                f"if either path changes, or runs a different number of times, the group desyncs or hangs.")
    h.evidence = {"seq": seq, "op": op, "repeats": count}
    return h
