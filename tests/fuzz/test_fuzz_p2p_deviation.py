"""Pipelines where one stage's send or recv goes wrong: skipped, issued twice, or to the wrong peer (`run
--inject skip|twice|repeer` on a real pipeline). The stages then wait on each other in a cycle of p2p waits,
and every rank on the cycle read as its culprit (`p2p_deadlock [0, 1]` for `twice:0`, `[0, 1, 2]` for
`repeer:0`, real runs). The evidence singles the rank out: the peer it waits on never posted a matching call
while others wait for it with that very call, or its calls depart from the round it repeated before while the
others keep theirs, or, before two whole rounds show, its calls part from those of the other stages of its role
(campaign run 75-12: GPipe on 8 ranks, a send skipped in the second step; p2p_roles.py). Over generated jobs
(trace_sets.py): never another rank alone; the deviating rank alone where the stages wait on each other, once it
has repeated its round twice; earlier, a rank read against its role is always the deviating one (whether the
role shows depends on whether the other middle stages went past the call: the real run shows it). A first or
last stage that goes wrong early has no role to be read against, and the peer it waits on may still be named."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from test_fuzz_invariant import CHECKS
from trace_sets import (Job, analyzed, dumped_for_hang, finished, pipeline_1f1b_deviated, pipeline_deviated,
                        pipeline_gpipe, pipeline_gpipe_deviated, pipeline_odd_half, pipeline_odd_message,
                        pipeline_rounds, run, traces)


@CHECKS
@given(pipeline_deviated())
def test_the_stage_that_deviates_from_its_own_round_is_named_alone(case):
    job, bad, at_round = case
    ts_in = traces(job, run(job))
    report = analyzed(job, ts_in, {r: "native" for r in ts_in})
    got = [(f.kind, f.ranks, f.detail[:220]) for f in report.findings]
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [bad]], got  # a false claim
    cycles = [f for f in report.findings if f.kind == "p2p_deadlock"]
    if cycles and at_round >= 3:  # two whole rounds before it: its own round shows
        assert cycles[0].ranks == [bad], got
    # earlier, where the other middle stages went past the call (p2p_roles.py; the real run 75-12 in
    # test_fuzz_drill_classes.py): a rank read against its role is the deviating one
    assert all(f.ranks == [bad] for f in report.findings if f.evidence.get("role") is not None), got


@CHECKS
@given(pipeline_1f1b_deviated())
def test_stages_whose_programs_differ_by_design_are_never_read_against_each_other(case):
    """1F1B: each stage's warm-up is shorter than the one before's, so the stages' calls part from each other like
    a staircase. Whatever goes wrong on one stage (a send or recv skipped, twice, to the wrong peer, or a stage
    that stops), no other rank is named alone for departing from a role it never had."""
    job, bad = case
    report = analyzed(job, traces(job, run(job)), {r: "native" for r in range(job.world)})
    got = [(f.kind, f.ranks, f.detail[:220]) for f in report.findings]
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [bad]
                and f.evidence.get("role") is not None], got
    # nor for a round its cool-down ends, where the peer owes it the message it waits for (campaign notes: the
    # rounds rule named a stage of 1F1B at its cool-down); no p2p cycle is ever pinned on another rank
    assert not [f for f in report.findings if f.kind == "p2p_deadlock" and len(f.ranks) == 1 and f.ranks != [bad]], got


@CHECKS
@given(pipeline_gpipe_deviated())
@example((Job(4, {"0": [0, 1, 2, 3]}, {"0": "default_pg"}, pipeline_gpipe(4, [4]), {1: ("twice", 1)}), 1, "twice"))
def test_what_a_stage_was_fed_and_passed_on_names_the_one_that_deviates(case):
    """GPipe with a step's micro-batch count its own, any stage's send or recv skipped, issued twice or to the
    wrong peer, sends that meet their receives or go into a buffer. The last stage has no role to be read
    against, nor two rounds of its own when the count changes from step to step: campaign runs 72-119, 73-70,
    74-117, 75-70, 75-102, 75-122 named it with its peer as one cycle `[2, 3]`; 4-stage middle stages likewise
    (74-2, 74-111, 75-150). The rounds rule also read GPipe's backward phase as a departure from its forwards
    and named a stage that kept to its program. What each stage was fed and passed on (p2p_flows.py) singles
    one out, and never another rank: no p2p cycle is pinned on a rank that did not deviate, and a rank the
    flows single out is the deviating one (the example: the rounds rule named rank 2, whose backward phase
    followed its four forwards, for rank 1's send issued twice). No rank is named alone but the deviating one,
    save a rank that finished its whole program, named missing where its peer waits on it: the generator keeps it
    idle in the user's code, where a real one exits (and says so in its dump)."""
    job, bad, _ = case
    ran = run(job)
    report = analyzed(job, traces(job, ran), {r: "native" for r in range(job.world)})
    got = [(f.kind, f.ranks, f.detail[:220]) for f in report.findings]
    ended = finished(ran)
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [bad]
                and not (f.kind == "missing_ranks" and set(f.ranks) <= ended)], got
    assert all(f.ranks == [bad] for f in report.findings if f.evidence.get("owed")), got


REAL_SHAPES = [
    # (stages, micro-batches per step, the rank, the fault, its call among its own sends and receives): the
    # campaign's pipeline program (1, 2, then 4 micro-batches a step) and the faults that hedged there
    (4, [1, 2, 4, 4, 4], 3, "twice", 22),  # 75-70: the last stage's 5th forward receive of its step
    (4, [1, 2, 4, 4, 4], 3, "skip", 17),  # 75-102: a forward receive skipped, the gradients sent back anyway
    (4, [1, 2, 4, 4, 4], 3, "skip", 12),  # 75-122: a gradient never sent, the next step's receive posted
    (4, [1, 2, 4, 4, 4], 1, "skip", 35),  # 75-150: a middle stage's forward send skipped
    (4, [1, 2, 4], 1, "peer", 12),  # 74-2: a middle stage's first receive of a step from the wrong peer
]


@pytest.mark.parametrize("world, micro, bad, fault, call", REAL_SHAPES)
def test_the_campaigns_end_stage_faults_are_named_alone(world, micro, bad, fault, call):
    """The stored runs' shapes, rebuilt with the campaign's sends (its end stages post a step's sends at once, its
    middle stages send one at a time): each names the deviating stage alone as the cycle's first finding."""
    steps = pipeline_gpipe(world, micro)
    mine = [i for i, s in enumerate(steps) if bad in (s.src, s.dst)]
    job = Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps, {bad: (fault, mine[call])},
              async_sends={0, world - 1})
    report = analyzed(job, traces(job, run(job)), {r: "native" for r in range(world)})
    got = [(f.kind, f.ranks, f.detail[:220]) for f in report.findings]
    assert report.findings and (report.findings[0].kind, report.findings[0].ranks) == ("p2p_deadlock", [bad]), got


@CHECKS
@given(pipeline_odd_message())
def test_the_stage_that_sent_an_odd_message_is_named_when_its_receiver_left_no_dump(case):
    """A stage sends its peer a message of another dtype or size (`retype:0` on a real pipeline, campaign run
    72-88): Gloo aborts the receiver, which leaves no dump, and the others die of the reset connection. The
    verdict named the receiver, `missing_dump [1]`. The sender's own calls show the odd one: a message none of its
    other sends to that peer carried, the last before the peer died (diagnose/parted.py)."""
    job, sender, receiver, fault = case
    ts_in = traces(job, run(job))
    del ts_in[receiver]  # aborted: no dump
    report = analyzed(job, ts_in, {r: "native" for r in ts_in})
    got = [(f.kind, f.ranks, f.detail[:200]) for f in report.findings]
    assert report.findings and (report.findings[0].kind, report.findings[0].ranks) == (
        fault.replace("message_", "") + "_mismatch", [sender]), got


@CHECKS
@given(pipeline_odd_message(), st.data())
def test_a_lost_stage_beside_dumps_that_show_nothing_is_one_of_every_rank(case, data):
    """The same runs in Gloo's Flight Recorder dumps (campaign runs 72-88, 73-31): they record no send or recv, so
    a pipeline's survivors' dumps hold nothing, and `missing_dump [1]` named the receiver alone, a false claim.
    Nothing there tells a stage that died of its own from one its peer's message killed: "one of" every rank
    (lost.py, `_blind_survivors`)."""
    job, sender, receiver, _ = case
    ts_in = traces(job, run(job))
    del ts_in[receiver]  # aborted: no dump
    forms = {r: data.draw(st.sampled_from(["pickle", "json"])) for r in ts_in}
    report = analyzed(job, ts_in, forms, p2p=False)
    first = report.findings[0]
    assert first.kind == "missing_dump" and first.evidence.get("undecided"), [(f.kind, f.ranks) for f in report.findings]
    assert sender in first.evidence["suspects"] and first.detail.startswith("one of "), first.detail


@CHECKS
@given(pipeline_odd_message(), st.data())
def test_a_lost_stage_beside_a_blind_sender_is_one_of_them(case, data):
    """The same runs with the sender's dump Gloo's Flight Recorder's (it shows no send) beside others' recorder
    traces that show the pipeline's sends and receives (campaign run 75-210, mixed forms): `missing_dump [2]`
    named the receiver alone. The blind sender may have sent it the message that killed it: "one of" them
    (lost.py, `_blind_senders`), never the receiver alone."""
    job, sender, receiver, _ = case
    ts_in = traces(job, run(job))
    del ts_in[receiver]  # aborted: no dump
    forms = {r: data.draw(st.sampled_from(["native", "pickle", "json"])) for r in ts_in}
    forms[sender] = data.draw(st.sampled_from(["pickle", "json"]))
    others = [r for r in ts_in if r != sender]
    if others:
        forms[data.draw(st.sampled_from(others))] = "native"
    report = analyzed(job, ts_in, forms, p2p=False)
    first = report.findings[0]
    got = [(f.kind, f.ranks, f.detail[:160]) for f in report.findings]
    assert sender in (first.evidence.get("suspects") or first.ranks), got


@CHECKS
@given(pipeline_odd_half())
def test_the_side_whose_half_of_a_pair_departs_from_its_own_is_named(case):
    """A send and its recv that disagree on size or dtype (`resize:0` on a real pipeline, campaign run 73-59, the
    recv's buffer resized): two sides and no majority read "one of ranks 0, 1". Each side's own calls on that
    pair weigh it: the side whose half is a message none of its other halves carried is wrong."""
    job, odd, fault = case
    report = analyzed(job, traces(job, run(job)), {r: "native" for r in range(job.world)})
    got = [(f.kind, f.ranks, f.detail[:200]) for f in report.findings]
    assert report.findings and (report.findings[0].kind, report.findings[0].ranks) == (
        fault.replace("message_", "") + "_mismatch", [odd]), got


@CHECKS
@given(pipeline_gpipe_deviated())
def test_a_peer_that_ran_its_program_to_its_end_owes_nothing_more(case):
    """The same pipelines where the stages that finished their program exit after destroy_process_group, as real
    ones do, and the rest dump when the hang is confirmed. A stage waiting on such a peer for a message the peer
    never had (a receive issued twice, a peer asked by mistake) named the peer `missing_ranks`: a false claim.
    A peer that ran to its end will neither receive nor send again, so what it owes is settled (p2p_flows.py):
    the waiter is named where its wait is one nobody owes, and no rank but the deviating one is named alone."""
    job, bad, _ = case
    ran = run(job)
    ended = finished(ran)
    ts = {r: dumped_for_hang(t, 31.0, True, done=r in ended) for r, t in traces(job, ran).items()}
    report = analyzed(job, ts, {r: "native" for r in range(job.world)})
    got = [(f.kind, f.ranks, f.detail[:220]) for f in report.findings]
    assert not [f for f in report.findings if len(f.ranks) == 1 and f.ranks != [bad]], got


@CHECKS
@given(pipeline_gpipe_deviated(), st.data())
def test_a_stage_whose_own_calls_show_a_send_nothing_fed_is_named_beside_blind_peers(case, data):
    """Mixed forms (campaign run 75-102): the last stage's recorder trace, its neighbour's Gloo Flight Recorder dump
    (no send or recv). The stage skipped a receive and sent the gradients back; its neighbour's dump cannot show
    whether it posted the receive, and the verdict was "one of" the blind ranks, without the stage. Its own calls
    show its send fed by nothing: it is named, whatever its peer did. Over generated pipelines in mixed forms,
    a rank named for what its own calls show is the deviating one, and no p2p cycle or send is pinned on another
    rank. (A lone blind peer a rank waits on is still named "suspected" alone: the waiter's extra call and the
    peer's missing one read alike there; left alone, docs/diagnose.md.)"""
    job, bad, _ = case
    forms = {r: data.draw(st.sampled_from(["native", "pickle", "json"])) for r in range(job.world)}
    forms[bad] = "native"
    report = analyzed(job, traces(job, run(job)), forms, p2p=False)
    got = [(f.kind, f.ranks, f.detail[:220]) for f in report.findings]
    assert all(f.ranks == [bad] for f in report.findings if f.evidence.get("owed")), got
    assert not [f for f in report.findings if f.kind == "p2p_deadlock" and len(f.ranks) == 1 and f.ranks != [bad]], got


def test_the_last_stage_that_sent_what_nothing_fed_is_named_beside_blind_peers():
    """75-102's shape, the middle stages' dumps Gloo's Flight Recorder's."""
    steps = pipeline_gpipe(4, [1, 2, 4, 4, 4])
    mine = [i for i, s in enumerate(steps) if 3 in (s.src, s.dst)]
    job = Job(4, {"0": [0, 1, 2, 3]}, {"0": "default_pg"}, steps, {3: ("skip", mine[17])}, async_sends={0, 3})
    report = analyzed(job, traces(job, run(job)), {0: "native", 1: "pickle", 2: "json", 3: "native"}, p2p=False)
    got = [(f.kind, f.ranks, f.detail[:220]) for f in report.findings]
    assert report.findings and (report.findings[0].kind, report.findings[0].ranks) == ("p2p_deadlock", [3]), got


@CHECKS
@given(st.integers(2, 6), st.integers(1, 4), st.data())
def test_an_odd_message_before_any_usual_one_leaves_the_lost_receiver_one_of_its_senders(world, rounds, data):
    """Campaign run 76-275 (GPipe on 8 ranks, `retype:5@call=4`): a stage retyped its first gradient send, Gloo
    aborted the receiver, and `missing_dump [4]` named the receiver alone. No two earlier sends to it carried a
    message to compare with (parted.py names a sender only against two usual ones), so nothing vouches for that
    send: "one of" the receiver and the stages whose last send to it is such a message (lost.py,
    `_unvouched_senders`), never the receiver alone."""
    steps = pipeline_rounds(world, rounds)
    first = list(range(2 * (world - 1)))  # the first round: no message established yet
    at = data.draw(st.sampled_from(first))
    sender, receiver = steps[at].src, steps[at].dst
    job = Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps,
              {sender: (data.draw(st.sampled_from(["message_size", "message_dtype"])), at), receiver: ("stop", at)})
    ts_in = traces(job, run(job))
    del ts_in[receiver]  # aborted: no dump
    report = analyzed(job, ts_in, {r: "native" for r in ts_in})
    first_finding = report.findings[0]
    got = [(f.kind, f.ranks, f.detail[:200]) for f in report.findings]
    assert first_finding.ranks != [receiver] or first_finding.evidence.get("undecided"), got
    assert sender in (first_finding.evidence.get("suspects") or first_finding.ranks), got
