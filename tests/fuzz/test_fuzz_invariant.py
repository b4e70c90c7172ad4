"""The verdict's guarantee, over generated trace sets (tests/fuzz/trace_sets.py): worlds of 1-8 ranks, overlapping
groups, p2p, faults planted per rank (stop, crash, skip, swap, other metadata, a collective on a group nobody else
uses, no dump), Gloo's late completion mark, in the recorder's and Flight Recorder's forms.

1. If any rank is blocked in a collective or p2p at dump time, or crashed, the verdict is never ok (also when
   the dumps show calls in states no execution explains); every such
   rank is named in a finding or listed in a consequence whose `finding` is a finding that exists (and whose
   `finding_ref` matches it); the text report never speaks of consequences when there is no finding.
2. On jobs with one fault, the first finding names the faulty rank, in the right words.
3. The same job, whatever mix of forms its ranks left, gives the same first finding as the recorder's traces of
   the same calls as those forms record them (trace_sets.as_recorded). A form that records less cannot tell
   more: Flight Recorder records no roots (a broadcast's root that differs is invisible in a dump), Gloo records
   a reduce_scatter as the all_reduce it runs (a dump's all_reduce may be either), and a JSON dump holds no stack.
   Where a job holds none of these, that is the recorder's own first finding.

Normal suite: a few dozen cases each. `python fuzz/run_fuzz.py -k invariant` runs 2000.
"""

from __future__ import annotations

import tempfile

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.report.diagnose_text import render_text
from distdoctor.trace.loaders import load_traces

from trace_sets import Job, _from_cpp, as_recorded, ground_truth, jobs, run, traces, write

LONG = settings.default.max_examples >= 2000
EXAMPLES = 2000 if LONG else 40
CHECKS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


FR_FORMS = ("pickle", "json")  # Flight Recorder's dumps alone ("both" is merged with the recorder's trace)


def _diagnose(job: Job, forms: dict[int, str] | None = None, recorded: dict[int, str] | None = None):
    """`recorded`: every rank's trace in the recorder's form, of its calls as the form it names records them."""
    ran = run(job)
    ts_in = traces(job, ran)
    assume(ts_in)  # every rank left no dump: nothing to diagnose
    for r, form in (recorded or {}).items():
        if form in FR_FORMS and r in ts_in:
            ts_in[r] = as_recorded(ts_in[r], frames=form == "pickle")
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
    _, _, native = _diagnose(job, recorded=forms)
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


def _two_ranks(steps, fault) -> Job:
    from trace_sets import Step

    return Job(world=2, groups={"0": [0, 1]}, descs={"0": "default_pg"},
               steps=[Step("0", op, size, "float32", root) for op, size, root in steps], faults={0: fault})


FORM_PAIRS = [{0: a, 1: b} for a in ("native", "pickle", "json") for b in ("native", "pickle", "json")]


def test_a_reduce_scatter_beside_an_all_reduce_is_told_apart_by_the_sizes_gloo_records():
    """Found by the invariant (seed 5): rank 0 skipped an all_reduce and called the next step's reduce_scatter
    where rank 1 called the all_reduce. Gloo records a reduce_scatter as an all_reduce of its whole input, so a
    Gloo dump's all_reduce beside the recorder's reduce_scatter was taken for the same call by name alone (and a
    Gloo dump's own `reduce_scatter` renamed too), and the job read `missing_ranks` [0] two calls later. The
    sizes Gloo records tell: rank 0's reduce_scatter of 16 is Gloo's all_reduce of 16, not rank 1's of 8. Every
    form names both ranks at #1 (one of them: two ranks, nothing weighs), as a different collective where a trace
    names the call, as different sizes where both dumps say all_reduce."""
    job = _two_ranks([("all_reduce", 8, None), ("reduce_scatter", 8, None), ("all_reduce", 4, None)], ("skip", 0))
    for forms in FORM_PAIRS:
        _, _, report = _diagnose(job, forms)
        f = report.findings[0]
        kind = "type_mismatch" if forms[0] == "native" else "size_mismatch"  # a trace names rank 0's call
        assert (f.kind, f.ranks, f.seq) == (kind, [0, 1], 1), (forms, f.kind, f.ranks, f.seq, f.detail)
        if forms == {0: "native", 1: "pickle"}:
            assert "reduce_scatter or all_reduce of that input" in f.detail, f.detail


def test_a_gloo_all_reduce_with_the_sizes_of_a_reduce_scatter_is_that_call():
    """The record fits: rank 1's all_reduce of 16 is what Gloo records for rank 0's reduce_scatter of 16. The dump
    cannot tell the two apart, so they are one call there; the job parts at #2, where rank 1's reduce_scatter,
    recorded as an all_reduce of 16, meets rank 0's all_reduce of 4."""
    job = _two_ranks([("all_reduce", 16, None), ("reduce_scatter", 8, None), ("all_reduce", 4, None)], ("skip", 0))
    _, _, native = _diagnose(job)
    assert (native.findings[0].kind, native.findings[0].seq) == ("type_mismatch", 1)
    _, _, report = _diagnose(job, {0: "pickle", 1: "json"})
    f = report.findings[0]
    assert (f.kind, f.ranks, f.seq) == ("size_mismatch", [0, 1], 2), (f.kind, f.ranks, f.seq)


def test_one_recorder_trace_against_one_dump_hedges_the_call_only_the_dump_holds():
    """The same job, rank 0 leaving only its recorder trace and rank 1 only its Gloo pickle: rank 1's extra call is
    either one issued from C++ (which the recorder never sees) or the call rank 0 skipped. One dump against one
    trace cannot tell: the finding must name both ranks ("one of"), never rank 1 alone."""
    job = _two_ranks([("all_reduce", 16, None), ("reduce_scatter", 8, None), ("all_reduce", 4, None)], ("skip", 0))
    _, _, report = _diagnose(job, {0: "native", 1: "pickle"})
    f = report.findings[0]
    assert 0 in f.ranks, (f.kind, f.ranks, f.seq)


def test_a_root_that_no_dump_records_is_no_finding():
    """Found by the invariant (seed 17): rank 0 swapped two broadcasts of different roots. The recorder's traces
    read `root_mismatch` (one of ranks 0, 1); Flight Recorder records no root, so where one of the two left only
    a dump, the roots cannot be compared and nothing is claimed (every call completed: no rank waits)."""
    job = _two_ranks([("broadcast", 4, 0), ("broadcast", 4, 1)], ("swap", 0))
    _, _, native = _diagnose(job)
    assert [(f.kind, f.ranks) for f in native.findings] == [("root_mismatch", [0, 1])]
    for forms in FORM_PAIRS[1:]:
        _, _, report = _diagnose(job, forms)
        assert report.verdict == "ok", (forms, [(f.kind, f.ranks) for f in report.findings])


def test_a_call_every_member_is_in_is_named_as_the_program_calls_it():
    """Found by the invariant (long profile, seed 99): both ranks shown inside a reduce_scatter (Gloo's late
    completion mark), rank 1's Gloo dump recording it as all_reduce. The in-flight finding took the call for two,
    one per name, and named it after whichever was created first (a dump's clock rounds otherwise than the
    recorder's); it is one call, the program's reduce_scatter."""
    from trace_sets import Step

    job = Job(world=2, groups={"0": [0, 1], "1": [0]}, descs={"0": "default_pg", "1": "undefined"},
              steps=[Step("0", "p2p", 4, src=0, dst=1)] * 2 + [Step("0", "reduce_scatter", 4)], faults={},
              late={0, 1})
    for forms in ({0: "native", 1: "pickle"}, {0: "json", 1: "native"}):
        for report in (_diagnose(job, forms)[2], _diagnose(job, recorded=forms)[2]):  # whoever's call came first
            f = report.findings[0]
            assert (f.kind, f.ranks, f.op, f.seq) == ("stuck_collective", [0, 1], "reduce_scatter", 1), (forms, f)


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


@st.composite
def resized_reduce_scatters(draw):
    """A job of all_reduces and reduce_scatters on one group of 3-6 ranks, one rank passing another size to one
    reduce_scatter; that rank left the recorder's trace (which names the call), the others Gloo's dumps (which
    record it as an all_reduce of its whole input)."""
    from trace_sets import Step

    world = draw(st.integers(3, 6))
    steps = [Step("0", draw(st.sampled_from(["all_reduce", "reduce_scatter"])), draw(st.sampled_from([4, 8])) * world)
             for _ in range(draw(st.integers(0, 3)))]
    at = len(steps)
    steps += [Step("0", "reduce_scatter", draw(st.sampled_from([4, 8])) * world)]
    steps += [Step("0", "all_reduce", 4) for _ in range(draw(st.integers(0, 2)))]
    rank = draw(st.integers(0, world - 1))
    job = Job(world=world, groups={"0": list(range(world))}, descs={"0": "default_pg"}, steps=steps,
              faults={rank: ("size", at)})
    forms = {r: "native" if r == rank else draw(st.sampled_from(["pickle", "json"])) for r in range(world)}
    return job, forms, rank


@CHECKS
@given(resized_reduce_scatters())
def test_a_resized_reduce_scatter_beside_gloo_dumps_is_a_size_mismatch(case):
    """Found by the real-job fuzzer (FSDP, `resize:2@call=5`, mixed forms): the recorder's reduce_scatter of
    another input beside Gloo dumps' all_reduce read `type_mismatch`: a claim the dumps cannot make (a Gloo
    all_reduce may be a reduce_scatter). Recorded as Gloo would record it, the name agrees and the sizes differ:
    the finding is the sizes, naming the rank that passed another, and says what the dumps cannot tell."""
    job, forms, rank = case
    _, _, report = _diagnose(job, forms)
    f = report.findings[0]
    assert (f.kind, f.ranks) == ("size_mismatch", [rank]), (f.kind, f.ranks, f.detail)
    assert "reduce_scatter or all_reduce of that input" in f.detail, f.detail
