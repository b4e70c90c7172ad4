"""A member its own watchdog saw blocked in a call waits in it, whether its trace holds the call or not
(diagnose/unseen.py, `mark_unseen`).

A real DCP run over DDP (4 ranks, rank 3 stopped in its optimizer step), read from one dump a rank: rank 3's
recorder trace shows it in no collective (its watchdog saw none in flight); rank 0's recorder trace cannot hold
the broadcast DDP issued from C++, yet its watchdog saw it blocked in #8; the Flight Recorder ranks had finished
#8 (the root's part, and a receiver's). No member whose trace holds #8 still waited in it, so rank 3 - whose
trace cannot see C++ calls either - was taken for neither present nor absent, and the verdict named rank 1 alone.

The family: one group; Python calls, then calls issued from C++; the stopped rank and a waiting rank leave the
recorder's trace alone (the waiter's watchdog names the call it is blocked in, the stopped one's none), the
others Flight Recorder pickles that show the call completed or in flight, or show them idle before it (Gloo
retires the call a rank was blocked in when the job is ended: rank 1 in the run). The stopped rank is among the
first finding's ranks: which of it and a rank idle in a bare Gloo dump stopped first, these dumps cannot say.
Or no member is seen waiting (the waiter left a Flight Recorder dump idle before the call, and the ranks in it
show it retired, which Gloo's dumps also show of a call that failed): the stopped rank is absent all the same
(`gloo-dcp-hang-retired-mixed`).
"""

from __future__ import annotations

import tempfile

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace

from real_dumps import diagnose_form, truth
from test_fuzz_invariant import CHECKS
from trace_sets import USER, Job, Step, blocking_call, write


def _call(i: int, op: str, done: bool) -> Entry:
    return blocking_call(i, op, done)


def _hang(blocked_in: dict | None, episode: dict) -> dict:
    return {"status": "confirmed", "detected_at": 1080.0, "since": 1050.0, "blocked_in": episode,
            "this_rank": {"blocked_in": blocked_in, "blocked_for_s": 30.0 if blocked_in else None,
                          "idle_for_s": 30.0}}


@st.composite
def watched(draw) -> tuple[Job, dict[int, RankTrace], dict[int, str], int]:
    """(the job, every rank's trace, its form, the rank that stopped)."""
    world = draw(st.integers(3, 8))
    python = draw(st.integers(1, 3))
    cpp = draw(st.integers(2, 4))
    steps = [Step("0", "broadcast") for _ in range(python)] + \
        [Step("0", draw(st.sampled_from(["broadcast", "all_reduce"])), cpp=True) for _ in range(cpp)]
    stopped, waiter = draw(st.permutations(range(world)))[:2]
    watched_wait = draw(st.booleans())  # else the waiter left a Flight Recorder dump idle before the call
    at = draw(st.integers(python, len(steps) - 1))  # the C++ call the others reached and the stopped rank never did
    episode = {"group": "0", "seq": at + 1, "op": steps[at].op, "source": "flight_recorder", "since": 1050.0}
    others = [r for r in range(world) if r not in (stopped, waiter)]
    most = len(others) - (0 if watched_wait else 1)  # unwatched, some rank must show the call, retired
    behind = draw(st.sets(st.sampled_from(others), max_size=most)) if others and most else set()
    out, forms = {}, {}
    for r in range(world):
        if r == stopped:
            calls, hang = [_call(i, steps[i].op, True) for i in range(at)], _hang(None, episode)
        elif r == waiter and watched_wait:
            calls, hang = [_call(i, steps[i].op, True) for i in range(at)], _hang(episode, episode)
        elif r == waiter:  # and the ranks in the call show it retired: no member's dump shows it still in it
            calls, hang = [_call(i, steps[i].op, True) for i in range(at)], None
        elif r in behind:  # blocked in the call before, which Gloo's dump retired when the job was ended
            calls, hang = [_call(i, steps[i].op, True) for i in range(at)], None
        else:  # the root's part, or a receiver's, done; or still in it
            calls = [_call(i, steps[i].op, i < at or not watched_wait or draw(st.booleans())) for i in range(at + 1)]
            hang = None
        forms[r] = "native" if r == stopped or (r == waiter and watched_wait) else "pickle"
        out[r] = RankTrace(rank=r, source="native", world_size=world, entries=calls,
                           groups={"0": GroupInfo("0", list(range(world)), False, "default_pg")},
                           stacks={"MainThread (1)": [Frame("<module>", USER, 1), Frame("step", USER, 300)]},
                           hang=hang, dump_reason="signal: SIGTERM", dump_time=1081.0 + 0.01 * r)
    job = Job(world=world, groups={"0": list(range(world))}, descs={"0": "default_pg"}, steps=steps, faults={})
    return job, out, forms, stopped


@CHECKS
@given(watched())
def test_a_rank_in_no_call_is_absent_from_the_call_a_watched_member_waits_in(case):
    job, traces, forms, stopped = case
    with tempfile.TemporaryDirectory() as d:
        write(d, job, traces, forms)
        ts = load_traces([d], world_size=job.world)
    assert ts.errors == [], ts.errors
    report = analyze(ts)
    first = report.findings[0]
    assert first.kind == "missing_ranks" and stopped in first.ranks, \
        [(f.kind, f.ranks, f.detail) for f in report.findings]


def test_the_real_dcp_run_read_from_one_dump_a_rank_names_the_rank_that_stopped():
    """`gloo-dcp-hang-watched-mixed`: rank 3 (recorder) stopped; rank 0 (recorder) watched in broadcast #8; rank 1
    a Flight Recorder pickle idle after #7, rank 2 a JSON dump past #8. Ranks 1 and 3 never issued #8."""
    fired = truth("gloo-dcp-hang-watched-mixed")
    assert (fired["kind"], fired["rank"]) == ("hang", 3)
    _, report = diagnose_form("gloo-dcp-hang-watched-mixed", "*rank_*", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [1, 3]), report["findings"]


def test_a_dcp_run_whose_call_only_gloo_retired_names_both_ranks_in_no_call():
    """`gloo-dcp-hang-retired-mixed`: rank 2 (recorder) stopped; ranks 1 and 3 (Flight Recorder) show broadcast #8
    retired, rank 0 (a pickle) idle after #7."""
    fired = truth("gloo-dcp-hang-retired-mixed")
    assert (fired["kind"], fired["rank"]) == ("hang", 2)
    _, report = diagnose_form("gloo-dcp-hang-retired-mixed", "*rank_*", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_ranks", [0, 2]), report["findings"]
