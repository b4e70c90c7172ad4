"""Timeline spans of a diagnose report for report.chrome_trace (Perfetto): one process per rank, one track per
process group; a collective spans from its creation to its completion when recorded, else to the rank's next
entry; the entry a rank is blocked in spans to the dump time and is marked blocked."""

from __future__ import annotations

from distdoctor.diagnose.analyze import Report
from distdoctor.report.chrome_trace import Span


def diagnose_spans(report: Report) -> list[Span]:
    spans: list[Span] = []
    pending_ids = {id(w.entry) for w in report.waits}
    times = [e.t_created for t in report.traces.ranks.values() for e in t.entries if e.t_created]
    if not times:
        return spans
    t0 = min(times)
    for rank, trace in report.traces.ranks.items():
        entries = [e for e in trace.entries if e.t_created]
        end_of_trace = max([trace.dump_time or 0.0] + [e.t_created for e in entries]
                           + [e.t_completed or 0.0 for e in entries])
        for i, e in enumerate(entries):
            if e.t_completed:
                end = e.t_completed
            elif e.state != "completed":
                end = end_of_trace
            else:
                end = entries[i + 1].t_created if i + 1 < len(entries) else end_of_trace
            seq = e.seq if not e.is_p2p else e.p2p_seq
            spans.append(Span(rank=rank, track=f"group {e.group}", name=f"{e.op} #{seq}",
                              start_us=(e.t_created - t0) * 1e6, dur_us=max(end - e.t_created, 1e-6) * 1e6,
                              blocked=id(e) in pending_ids or e.state != "completed",
                              args={"group": e.group, "seq": seq, "state": e.state, "sizes": e.in_sizes,
                                    "dtypes": e.in_dtypes}))
    return spans
