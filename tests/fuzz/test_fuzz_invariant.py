"""The verdict's guarantee, over generated trace sets (tests/fuzz/trace_sets.py): worlds of 1-8 ranks, overlapping
groups, p2p, faults planted per rank (stop, crash, skip, swap, other metadata, a collective on a group nobody else
uses, no dump), Gloo's late completion mark, in the recorder's and Flight Recorder's forms.

1. If any rank is blocked in a collective or p2p at dump time, or crashed, the verdict is never ok (also when
   the dumps show calls in states no execution explains); every such
   rank is named in a finding or listed in a consequence whose `finding` is a finding that exists (and whose
   `finding_ref` matches it); the text report never speaks of consequences when there is no finding.
2. On jobs with one fault, the first finding names the faulty rank, in the right words.
3. The same job, whatever mix of forms its ranks left, gives the same first finding.

Normal suite: a few dozen cases each. `python fuzz/run_fuzz.py -k invariant` runs 2000.
"""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.report.diagnose_text import render_text
from distdoctor.trace.loaders import load_traces

from trace_sets import Job, _from_cpp, ground_truth, jobs, run, traces, write

LONG = settings.default.max_examples >= 2000
EXAMPLES = 2000 if LONG else 40
CHECKS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _diagnose(job: Job, forms: dict[int, str] | None = None):
    ran = run(job)
    ts_in = traces(job, ran)
    assume(ts_in)  # every rank left no dump: nothing to diagnose
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts_in, forms or {})
        ts = load_traces([d])
    assert ts.errors == [], ts.errors
    return ran, ts, analyze(ts)


@CHECKS
@given(st.one_of(jobs(), jobs(noise=True)))
def test_no_blocked_or_crashed_rank_goes_unexplained(job):
    ran, ts, report = _diagnose(job)
    doc = report.to_json()
    findings = doc["findings"]
    for c in doc["consequences"]:
        assert 0 <= c["finding"] < len(findings), c
        f = findings[c["finding"]]
        assert c["finding_ref"] == {"kind": f["kind"], "group": f["group"], "seq": f["seq"]}
    blocked, crashed = ground_truth(job, ran)
    pending = {int(r) for r, p in doc["ranks"].items() if p.get("pending")}
    named = {r for f in findings for r in f["ranks"]}
    explained = named | {r for c in doc["consequences"] for r in c["ranks"]}
    if not job.flips:  # the dumps agree with the execution: the analysis sees every blocked rank
        assert blocked <= pending | named, (blocked, pending, named)
    must = (set() if job.flips else blocked) | crashed | pending  # with flips, only the evidence counts
    if must:
        assert doc["verdict"] == "problem"
    assert must <= explained, (must - explained, doc["findings"], doc["consequences"])
    for r in crashed:
        assert doc["ranks"][str(r)]["state"] == "crashed"
    text = render_text(report)
    if not findings:  # OK, or - when no rank's trace holds a single call - no verdict at all, never a claim
        no_calls = not any(len(t.entries) for t in report.traces.ranks.values())
        assert "consequences" not in text
        assert text.startswith("verdict: UNDECIDED" if no_calls else "verdict: OK"), text
        assert (doc["verdict"] == "undecided") == no_calls
    for r in crashed:
        line = next(x for x in text.split("where each rank is:")[1].splitlines() if x.startswith(f"  rank {r}:"))
        assert "crashed" in line and "in no collective" not in line


@CHECKS
@given(jobs(late=False, stale=True))
def test_a_rank_still_in_a_collective_took_part_in_no_later_one(job):
    """Some ranks' collectives never show completed (async, never waited on). A rank said to be still in
    collective #n (state_mismatch) did not take part in #n+1 where a peer's completed mark shows it did (a
    collective needs every member): else one verdict would say 'still in #1' beside 'went on to #16'. And the
    ranks said never to reach the collective the others went on to stopped inside #n: one numbering, #n then
    the next."""
    ran, ts, report = _diagnose(job)
    for f in report.findings:
        if f.kind != "state_mismatch":
            continue
        view = report.views[f.group]
        for r in f.ranks:
            nxt = view.by_rank[r].get(f.seq + 1)
            took_part = nxt is not None and nxt.op not in ("broadcast", "scatter") and any(
                view.last_completed.get(m, -1) > f.seq for m in view.by_rank if m != r)
            assert not took_part, (job, f.detail)
        later = f.evidence.get("then_absent_from")
        if later:
            assert later["seq"] > f.seq and all(view.hi(r) == f.seq for r in later["ranks"]), (job, f.detail)


ONE_FAULT = ("stop", "crash", "no_dump", "size", "dtype", "op")


@CHECKS
@given(jobs(faults=ONE_FAULT, max_faults=1, late=False))
def test_one_fault_names_the_faulty_rank(job):
    assume(job.faults)
    (rank, (fault, at)), = job.faults.items()
    ran, ts, report = _diagnose(job)
    blocked, crashed = ground_truth(job, ran)
    first = report.findings[0] if report.findings else None
    if fault in ("stop", "crash", "no_dump"):
        if not blocked and rank not in crashed:
            return  # nobody waits for the rank (it had no call left with others)
        kind = {"stop": ["missing_ranks"], "crash": ["crashed"], "no_dump": ["missing_dump"]}[fault]
        if fault == "crash" and rank not in crashed:  # blocked before it got to its crash
            return
        if fault == "crash" and "Connection closed" in job.crash_text:
            kind.append("missing_ranks")  # a communication failure is not a crash on its own: where the others wait
        assert first is not None and first.ranks == [rank] and first.kind in kind, (job, report.findings)
        return
    step = job.steps[at]
    if step.op in ("p2p", "barrier") or (step.op, fault) == ("scatter", "size") or len(job.groups[step.group]) < 3 or rank not in job.groups[step.group] or \
            any(f[0] != "none" for r, f in job.faults.items() if r != rank):
        return  # no metadata to differ on (a scatter's sizes are the root's alone), or no majority
    kind = {"size": "size_mismatch", "dtype": "dtype_mismatch", "op": "type_mismatch"}[fault]
    assert first is not None and first.kind == kind and first.ranks == [rank], (job, report.findings)


SAME_IN_EVERY_FORM = ("none", "stop", "skip", "swap", "size", "dtype", "op", "lone", "no_dump")


@CHECKS
@given(jobs(faults=SAME_IN_EVERY_FORM), st.data())
def test_the_same_first_finding_whatever_forms_the_ranks_left(job, data):
    forms = {r: data.draw(st.sampled_from(["native", "pickle", "json", "both"])) for r in range(job.world)}
    _, _, native = _diagnose(job)
    _, _, mixed = _diagnose(job, forms)

    def first(report):
        if not report.findings:
            return None
        f = report.findings[0]
        return f.kind, f.ranks, f.group, f.op, f.seq if f.op not in ("send", "recv") else None

    assert first(native) == first(mixed), (forms, native.findings[:1], mixed.findings[:1])


def test_a_scatter_member_receiving_another_dtype_is_seen_in_every_form():
    """Found by test_the_same_first_finding_whatever_forms_the_ranks_left: a scatter's non-root members pass no
    input, so a wrong dtype shows only in their output. The agreed-prefix proof compared input dtypes only and
    skipped the call in the recorder's form, while a Flight Recorder dump (no root recorded) was compared and
    gave a dtype_mismatch: one job, two first findings."""
    from trace_sets import Step

    def step(op, **kw):
        return Step(group="0", op=op, size=4, dtype="float32", root=kw.get("root"), src=kw.get("src"),
                    dst=kw.get("dst"))

    steps = [step("p2p", src=0, dst=1), step("scatter", root=1)] + [step("p2p", src=0, dst=1) for _ in range(6)]
    job = Job(world=3, groups={"0": [0, 1, 2]}, descs={"0": "default_pg"}, steps=steps,
              faults={1: ("no_dump", 0), 0: ("dtype", 1)}, eager_sends=False, late=set(), flips=set(),
              crash_text="RuntimeError: boom")
    firsts = set()
    for forms in ({}, {0: "native", 1: "native", 2: "pickle"}, {0: "json", 2: "native"}):
        _, _, report = _diagnose(job, forms)
        f = report.findings[0]
        firsts.add((f.kind, f.group, f.op, f.seq))
        assert {"dtype_mismatch", "missing_dump"} <= {g.kind for g in report.findings}
    assert firsts == {("dtype_mismatch", "0", "scatter", 1)}


MIXED_FAULTS = ("none", "stop", "crash", "skip", "size", "dtype", "op", "no_dump")


def _first_ranks(report):
    return (report.findings[0].kind, tuple(report.findings[0].ranks)) if report.findings else None


def _shown(job: Job, ran: dict, forms: dict[int, str]) -> bool:
    """Whether some rank's dump, in the form it left, shows a rank blocked or crashed: the blocked call in Flight
    Recorder's form or, when Python issued it, the recorder's; the exception in the recorder's."""
    blocked, crashed = ground_truth(job, ran)
    for r in blocked:
        calls, issued, _ = ran[r]
        if forms[r] != "native" or not _from_cpp(job, calls[issued - 1]):
            return True
    return any(forms[r] in ("native", "both") for r in crashed)


@CHECKS
@given(jobs(faults=MIXED_FAULTS, max_faults=1, late=False, cpp=True), st.data())
def test_calls_the_recorder_cannot_see_make_no_claim_when_ranks_left_different_forms(job, data):
    """Some collectives are issued from C++ (DDP's buckets): Flight Recorder numbers them, the recorder does not
    see them. Ranks that left only the recorder's trace beside ranks that left only Flight Recorder's dump are
    numbered by two authorities: a healthy job has no finding whatever forms its ranks left, and a job with one
    fault has the first finding (kind and ranks) of the all-recorder or the all-Flight-Recorder set, never a
    third - none only when no dump shows a blocked or crashed rank."""
    forms = {r: data.draw(st.sampled_from(["native", "pickle", "json", "both"])) for r in range(job.world)}
    ran, _, mixed = _diagnose(job, forms)
    if not job.faults:
        assert mixed.findings == [], (forms, mixed.findings[:1])
        return
    allowed = {_first_ranks(_diagnose(job)[2]), _first_ranks(_diagnose(job, dict.fromkeys(forms, "pickle"))[2])}
    if _shown(job, ran, forms):
        allowed.discard(None)
        assert mixed.verdict == "problem", (forms, ground_truth(job, ran))
    got = _first_ranks(mixed)
    if got is not None and mixed.findings[0].evidence.get("undecided"):
        # a rank whose form cannot see the call leaves a tie the evidence cannot break: "one of ranks ...",
        # among them the one the other forms name
        (rank, _), = job.faults.items()
        assert rank in got[1] and got[0] in {a[0] for a in allowed if a}, (forms, mixed.findings[:1], allowed)
        return
    if got is not None and got[1] == (next(iter(job.faults)),) and got[0] == "missing_ranks":
        return  # the faulty rank alone, as the one the others wait for: its form cannot show the call it skipped
    assert got in allowed | {None} - ({None} if _shown(job, ran, forms) else set()), \
        (forms, mixed.findings[:1], allowed)
