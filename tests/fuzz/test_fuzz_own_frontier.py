"""A recorder-only rank's own frontier says which of its group's calls it never issued
(trace/loaders/align_ranks.py, `unseen_of`; the recorder writes it: recorder/dumpfile.py, `fr_standing`).

A real tensor-parallel run (4 ranks on a 2 x 2 mesh, rank 2 stopped in its optimizer step), read from one dump a
rank: rank 2 left only the recorder's trace, ranks 0, 1, 3 Flight Recorder dumps. Rank 0 was blocked in the data
parallel all_reduce #5 with rank 2, but Gloo retired that call when the job was ended (rank 2's end closed the
connection), so rank 0's dump shows it idle; rank 1 was still in the tensor-parallel all_reduce #6 with rank 0.
Rank 2's trace could not hold #5 (a kind of call it had never seen: it might have come from C++), so rank 2 was
neither present nor absent, and the verdict named rank 0: `missing_ranks [0]` at #6. Rank 2's own Flight
Recorder numbers every call its communicator issued, from Python or C++; its frontier in the trace
(`pg_status`) says it issued #4 last on that group, and #5 is then a call it never issued.

The family: a rows x cols mesh (row groups issue their all_reduce from C++, column groups from Python, a new kind
of call last); one rank stops before a column call; the others run until nothing moves. The stopped rank leaves
the recorder's trace with its frontier; each other rank the recorder's trace (with its frontier) or a Flight
Recorder pickle, which shows a call that waited for the stopped rank retired or not, as Gloo leaves it when
the job is ended. The first finding names the stopped rank alone, missing from its column's call.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st


from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import Job, Step, analyzed, run, traces, with_frontier


def _mesh(rows: int, cols: int) -> tuple[dict[str, list[int]], list[str], list[str]]:
    """Groups of a rows x cols mesh numbered as torch numbers them: the world, then each row, then each column."""
    groups = {"0": list(range(rows * cols))}
    row_names = [str(1 + i) for i in range(rows)]
    col_names = [str(1 + rows + j) for j in range(cols)]
    for i, name in enumerate(row_names):
        groups[name] = [i * cols + j for j in range(cols)]
    for j, name in enumerate(col_names):
        groups[name] = [i * cols + j for i in range(rows)]
    return groups, row_names, col_names


def _program(draw, row_names: list[str], col_names: list[str]) -> tuple[list[Step], list[int]]:
    """The steps of the job, and the indices of the column calls (where a rank can stop)."""
    steps = [Step(g, "broadcast", 8, root=int(g) - 1) for g in row_names]  # the weights' first broadcast: Python
    stops = []
    for _ in range(draw(st.integers(1, 2))):
        steps += [Step(g, "all_reduce", 8, cpp=True) for g in row_names]  # the forward's all_reduce: C++
        for _ in range(draw(st.integers(1, 2))):  # the gradients, by hand: Python
            stops += list(range(len(steps), len(steps) + len(col_names)))
            steps += [Step(g, "all_reduce", 16) for g in col_names]
        stops += list(range(len(steps), len(steps) + len(col_names)))
        steps += [Step(g, "all_reduce", 1) for g in col_names]  # the loss: a kind of call not seen before
    return steps, stops


def _retired(trace, stopped_groups: set[str]):
    """What Gloo's dump shows once the job was ended: the call this rank waited in for the stopped rank failed
    when that rank's process went, and is retired as if completed."""
    entries = [replace(e, state="completed") if e.state != "completed" and e.group in stopped_groups else e
               for e in trace.entries]
    return replace(trace, entries=entries)


@st.composite
def stopped_in_mesh(draw):
    rows, cols = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (2, 4), (4, 2)]))
    groups, row_names, col_names = _mesh(rows, cols)
    steps, stops = _program(draw, row_names, col_names)
    at = draw(st.sampled_from(stops))
    stopped = draw(st.sampled_from(groups[steps[at].group]))
    job = Job(rows * cols, groups, {g: "default_pg" if g == "0" else "mesh" for g in groups}, steps,
              {stopped: ("stop", at)})
    out, forms = {}, {}
    hit = {g for g, m in groups.items() if stopped in m and g != "0"}
    for r, t in traces(job, run(job)).items():
        native = r == stopped or draw(st.booleans())
        forms[r] = "native" if native else "pickle"
        out[r] = with_frontier(t, groups) if native else (_retired(t, hit) if draw(st.booleans()) else t)
        out[r] = replace(out[r], dump_reason="signal: SIGTERM", dump_time=2000.0 + 0.01 * r)
    if all(f == "native" for f in forms.values()):
        other = next(r for r in out if r != stopped)
        forms[other] = "pickle"
    return job, out, forms, stopped


@CHECKS
@given(stopped_in_mesh())
def test_the_stopped_rank_is_named_by_its_own_frontier(case):
    job, out, forms, stopped = case
    report = analyzed(job, out, forms, p2p=False, listed=False)
    first = report.findings[0]
    assert (first.kind, first.ranks) == ("missing_ranks", [stopped]), \
        [(f.kind, f.ranks, f.detail) for f in report.findings]


def test_the_real_tp_run_read_from_one_dump_a_rank_names_the_rank_that_stopped():
    """`gloo-tp-hang-frontier-mixed`: rank 2 (recorder, with its frontier) stopped; rank 0 (pickle) shows the
    data-parallel all_reduce #5 retired; rank 1 (JSON) still in the tensor-parallel #6."""
    fired = truth("gloo-tp-hang-frontier-mixed")
    assert (fired["kind"], fired["rank"]) == ("hang", 2)
    _, report = diagnose_form("gloo-tp-hang-frontier-mixed", "*rank_*", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [2]), report["findings"]
