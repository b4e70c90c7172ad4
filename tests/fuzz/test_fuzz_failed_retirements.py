"""A call that failed is not a call that completed, whoever's dump says so (trace/loaders/completion.py).

Gloo's Flight Recorder retires a call that failed (the peer's connection closed) as it retires one that completed.
When a launcher ends a hung job's ranks one by one, a rank that outlives a peer by a moment sees its connection
close, raises, and its exception handler dumps again over its stall dump: the call it was blocked in now reads
completed, and the rank idle past it. Its peers' dumps say nothing of their end (Flight Recorder's never do), yet
they refute it when they were held: waiting in a call a held rank never issued, down a chain to a rank whose process
ended or around a cycle.

The family: generated programs over overlapping groups (trace_sets.py; every group warmed up by one call, as a
model's first forward does, so each member's dump holds that group), with ranks calling two steps in swapped order
(order deadlocks) or raising (the recorder's dump says so), written as Gloo's Flight Recorder writes them (pickle
or JSON, no send/recv) or as `distdoctor run` leaves them (the recorder's trace and the Flight Recorder dump of
each rank; a rank that raised always so: a bare Flight Recorder dump never says its process ended, and a
recorder-only trace vouches only for the calls its alignment placed, align_ranks.py). Any subset of the blocked Flight Recorder ranks is then
redumped after its call failed. Whatever the subset, the verdict and its first finding are those of the dumps taken
while blocked. A real run is kept as a fixture: `tests/doctor/real/jobs.py`'s `hsdp_group_order` (ranks of a 2x2
mesh reduce over its dimensions in different orders) whose launcher killed the ranks a second apart, three of them
dumping again when their peer's connection closed (`gloo-hsdp-killed-in-turn`).
"""

from __future__ import annotations

import tempfile
from dataclasses import replace

from hypothesis import assume, given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces

from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import Job, Step, ground_truth, jobs, run, traces, write


@st.composite
def held_jobs(draw) -> tuple[Job, dict[int, str], set[int]]:
    """(a job, each rank's form, the blocked Flight Recorder ranks whose dump is taken after their call failed)."""
    drawn = draw(jobs(max_world=6, faults=("none", "swap", "crash"), late=False))
    steps = [s for s in drawn.steps if s.op != "p2p"]  # Gloo's dumps hold no send/recv: a p2p wait holds nothing
    assume(steps)
    warm = [Step(g, "all_reduce", 4) for g in sorted(drawn.groups)]
    faults = {r: (f, len(warm) + min(at, len(steps) - 1)) for r, (f, at) in drawn.faults.items()}
    job = Job(drawn.world, drawn.groups, drawn.descs, warm + steps, faults, crash_text=drawn.crash_text)
    forms = {r: "both" if job.faults.get(r, ("none",))[0] == "crash" else
             draw(st.sampled_from(["pickle", "json", "pickle", "both"])) for r in range(job.world)}
    blocked, _ = ground_truth(job, run(job))
    fr_blocked = sorted(r for r in blocked if forms[r] != "both")
    assume(fr_blocked)
    failed = set(draw(st.sets(st.sampled_from(fr_blocked), min_size=1)))
    return job, forms, failed


@st.composite
def stopped_bare_jobs(draw) -> tuple[Job, dict[int, str], set[int], frozenset]:
    """(a job on a rows x cols mesh (each row's group, then each column's, per step, as tensor and data parallel
    reduce) in which one rank stops in Python, every rank's dump a bare Flight Recorder one (pickle or JSON: no
    dump reason, so none says its process ended), the blocked ranks whose dump is taken after their call failed,
    the blocked ranks that reached their call late, `_late`)."""
    rows, cols = draw(st.integers(2, 3)), draw(st.integers(2, 3))
    grid = [[r * cols + c for c in range(cols)] for r in range(rows)]
    groups = {str(1 + i): row for i, row in enumerate(grid)}
    groups.update({str(1 + rows + c): [row[c] for row in grid] for c in range(cols)})
    rounds = [[Step(g, "all_reduce", 4) for g in sorted(groups, key=int)] for _ in range(draw(st.integers(2, 3)))]
    steps = [s for r in rounds for s in (r if draw(st.booleans()) else r[rows:] + r[:rows])]
    stopped = draw(st.integers(0, rows * cols - 1))
    job = Job(rows * cols, groups, {g: "mesh" for g in groups}, steps,
              {stopped: ("stop", draw(st.integers(len(groups), len(steps) - 1)))})
    forms = {r: draw(st.sampled_from(["pickle", "json"])) for r in range(job.world)}
    blocked, _ = ground_truth(job, run(job))
    assume(blocked)
    return (job, forms, set(draw(st.sets(st.sampled_from(sorted(blocked)), min_size=1))),
            frozenset(draw(st.sets(st.sampled_from(sorted(blocked))))))


def _failed_under(trace):
    """The rank's dump written after its blocked call failed: Gloo retired that call, no completion time."""
    entries = list(trace.entries)
    i = max(k for k, e in enumerate(entries) if e.state != "completed")
    entries[i] = replace(entries[i], state="completed", t_completed=None)
    return replace(trace, entries=entries)


def _late(trace):
    """The rank reached the call it blocks in late (it computed longer): issued after calls its peers made later
    in the program, so the time of the calls does not order the ranks' stops."""
    entries = list(trace.entries)
    i = max(k for k, e in enumerate(entries) if e.state != "completed")
    entries[i] = replace(entries[i], t_created=entries[i].t_created + 30.0)
    return replace(trace, entries=entries)


def _diagnose(job: Job, forms: dict[int, str], failed: set[int], late: frozenset = frozenset()):
    ts_in = traces(job, run(job))
    ts_in = {r: _late(t) if r in late else t for r, t in ts_in.items()}
    ts_in = {r: _failed_under(t) if r in failed else t for r, t in ts_in.items()}
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, forms, p2p=False)
        ts = load_traces([d], world_size=job.world)
    assert ts.errors == [], ts.errors
    return ts, analyze(ts)


def _first(report) -> tuple:
    return (report.verdict, *((report.findings[0].kind, report.findings[0].ranks) if report.findings else ()))


@CHECKS
@given(held_jobs())
def test_a_dump_taken_after_its_call_failed_reads_as_the_dump_taken_while_blocked(case):
    job, forms, failed = case
    _, blocked_report = _diagnose(job, forms, set())
    ts, report = _diagnose(job, forms, failed)
    assert _first(report) == _first(blocked_report), (job.faults, forms, failed, [f.detail for f in report.findings])
    assert {x["rank"] for x in ts.refuted} == failed, ts.refuted


@CHECKS
@given(held_jobs())
def test_nothing_is_read_back_where_the_dumps_agree(case):
    """The dumps taken while blocked hold no retirement a member lacks: nothing is read back."""
    job, forms, _ = case
    ts, _ = _diagnose(job, forms, set())
    assert ts.refuted == []


@CHECKS
@given(stopped_bare_jobs())
def test_a_bare_dump_of_a_rank_in_no_call_ends_the_chain_of_failed_calls(case):
    """Every dump a bare Flight Recorder one: none says its process ended. A rank stopped in Python; ranks blocked
    in calls it never issued (or in calls of ranks so blocked) dumped after those calls failed, retired as if
    completed. Read as pictures of ranks that went on, every dump of the chain but the stopped rank's would be
    stale; read as each rank's last word, none is, and the verdict is that of the dumps taken while blocked. Two
    campaign runs named a rank held by the stopped one instead (a 2x2 tensor-parallel mesh: 71-100, 71-134)."""
    job, forms, failed, late = case
    _, blocked_report = _diagnose(job, forms, set(), late)
    ts, report = _diagnose(job, forms, failed, late)
    assert _first(report) == _first(blocked_report), (job.faults, forms, failed, [f.detail for f in report.findings])


@CHECKS
@given(stopped_bare_jobs())
def test_bare_dumps_that_agree_read_nothing_back(case):
    job, forms, _, late = case
    ts, _ = _diagnose(job, forms, set(), late)
    assert ts.refuted == []


def test_a_real_hang_whose_ranks_were_killed_in_turn_is_the_cycle_it_was():
    """HSDP over a 2x2 mesh, the gradient norm reduced over the mesh dimensions in different orders on ranks 1, 2
    and 0, 3: a cycle of four waits. The launcher killed rank 0 first, the others a second apart; ranks 1, 2, 3 saw
    a connection close and dumped again, their blocked all_reduce retired (`gloo-hsdp-killed-in-turn`)."""
    code, report = diagnose_form("gloo-hsdp-killed-in-turn", "fr_rank_*", 4)
    assert code == 1
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("order_deadlock", [0, 1, 2, 3]), first["detail"]
    assert sorted(x["rank"] for x in report["retired_in_flight"]) == [1, 2, 3]
    assert all("member_waits_in" in x for x in report["retired_in_flight"])


def test_real_tensor_parallel_runs_whose_held_ranks_dumped_after_their_call_failed_name_the_stopped_rank():
    """A 2x2 tensor-parallel mesh. Rank 3 raised at a step; every rank left a bare Flight Recorder pickle, the
    ranks held by it (directly, or through rank 1) retired the calls that failed under them
    (`gloo-tp-raise-retired-fr`, 71-100). Rank 3 slept at a step; rank 2 left the recorder's trace, the others
    bare Flight Recorder dumps, rank 1 its data-parallel all_reduce retired (`gloo-tp-hang-retired-mixed`,
    71-134). Both named rank 1, held by rank 3, the first time."""
    for fixture in ("gloo-tp-raise-retired-fr", "gloo-tp-hang-retired-mixed"):
        fired = truth(fixture)
        _, report = diagnose_form(fixture, "rank_*", 4)
        first = report["findings"][0]
        assert (first["kind"], first["ranks"]) == ("missing_ranks", [fired["rank"]]), (fixture, report["findings"])
        assert any(x["never_issued_by"] == fired["rank"] for x in report["retired_in_flight"]), fixture
