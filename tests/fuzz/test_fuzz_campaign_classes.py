"""Classes the real-job campaign found (docs/diagnose.md, "The real-job fuzzer"), each pinned by the run that found
it: its dumps, as the campaign scored them, kept under tests/fixtures/.

- A rank ended on its way (diagnose/ended.py): FSDP, rank 0 SIGSEGVed (no dump); the launcher's SIGTERM ended
  rank 3 a tenth of a second behind its peers, between two calls. It is no culprit: the lost rank is. The converse
  (a rank that skipped the call and went on, away four times its peers' stretch) is `gloo-ddp-skip`
  (test_fuzz_lost_peers.py): both sides of the rule are real runs.
- A rank a signal ended, nothing else in the dumps: never OK (crash.signalled).
- A communication failure echoes the peer found absent (explain.py, `_gone_peer`), not a crash of its own.
- A rank Flight Recorder shows in no call is behind, not past the call: a lost rank leads it (lost.py,
  `_blind_to_cpp`); only the recorder's trace, blind to C++-issued calls, can show a rank gone on past a call.
- A skip shifts every later call: a group whose other member Gloo aborted is judged against its sibling groups'
  collectives too, not only their sizes (siblings.py, `_departure`).
- A Python call a recorder-only rank never recorded is one it never issued, even inside torch (analyze.py: only
  calls its trace cannot see may be ones it is in).
- A recorder call that fits no Flight Recorder call of its dtype is placed by its element count before its
  collective alone (trace/loaders/align_ranks.py): a retyped call shows where it is.
- An error of its own decides an even vote (ties.py, `own_errors`); a dtype changed at a group's first call is
  judged against the sibling groups (the same collective there vouches for the program).
- Lateness by role (straggler.py, `_late_by_role`): the member at the same place of every tensor-parallel group
  late by the same work is the program, not a straggler.
- No collective completes without every member (trace/loaders/completion.py): Gloo's Flight Recorder retires a
  call that failed as one that completed; a member whose process ended and never issued the call refutes it.
- A call after a recorder-only rank's last one, of a kind its recorder saw at every place before, is one it
  never issued (align_ranks.py, `_seen_kinds_after`), and a rank inside torch is "probably inside" only a call its
  recorder cannot see (progress.probably_inside, RankTrace.would_show).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.loaders import load_traces
from real_dumps import FIXTURES, diagnose_form, truth


def _first(report: dict):
    findings = report["findings"]
    return (findings[0]["kind"], findings[0]["ranks"]) if findings else None


def test_a_rank_ended_on_its_way_is_no_culprit_for_the_rank_that_died():
    fired = truth("gloo-fsdp-sigsegv-behind")
    assert (fired["kind"], fired["rank"], fired["arg"]) == ("kill", 0, "SIGSEGV")
    _, report = diagnose_form("gloo-fsdp-sigsegv-behind", "rank_*.jsonl", 4)
    assert _first(report) == ("missing_dump", [0]), report["findings"]
    assert not any(3 in f["ranks"] for f in report["findings"]), report["findings"]
    on_way = [c for c in report["consequences"] if "on their way" in c["because"]]
    assert on_way and on_way[0]["ranks"] == [3], report["consequences"]


def test_a_rank_that_skipped_and_went_on_is_not_on_its_way():
    """The converse, nearest the line: DDP, rank 2 skipped its loss all_reduce and went on into the next step;
    Gloo aborted rank 1 (no dump) and the launcher ended rank 2 three times its peers' stretch after its last
    call (`gloo-ddp-skip-fast`)."""
    fired = truth("gloo-ddp-skip-fast")
    assert (fired["kind"], fired["rank"]) == ("skip", 2)
    _, report = diagnose_form("gloo-ddp-skip-fast", "rank_*.jsonl", 4)
    assert _first(report) == ("missing_ranks", [2]), report["findings"]


def test_flight_recorder_dumps_alone_cannot_show_a_rank_on_its_way():
    """Gloo's dumps carry no end time: the absent rank and the lost one are "one of" there, never rank 3 alone
    ahead of a hedge."""
    _, report = diagnose_form("gloo-fsdp-sigsegv-behind", "rank_*.fr.pkl", 4)
    lost = next(f for f in report["findings"] if f["kind"] == "missing_dump")
    assert lost["ranks"] == [0] and lost["detail"].startswith("one of ranks 0, 3"), report["findings"]


def test_a_rank_flight_recorder_shows_behind_does_not_outrank_the_lost_one():
    """DCP, rank 2 SIGSEGVed, Flight Recorder's dumps alone: the coordinator, rank 0, had not issued the next
    broadcast. Flight Recorder numbers every call, C++'s too: a rank it shows in no call issued none after, it is
    behind, not past the call (a skip shows as another call there). The lost rank leads, "one of" with it."""
    fired = truth("gloo-dcp-sigsegv-fr")
    assert (fired["kind"], fired["rank"], fired["arg"]) == ("kill", 2, "SIGSEGV")
    _, report = diagnose_form("gloo-dcp-sigsegv-fr", "rank_*.fr.pkl", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("missing_dump", [2]), report["findings"]
    assert first["detail"].startswith("one of ranks 0, 2"), first["detail"]


def test_a_rank_a_signal_ended_is_never_ok():
    fired = truth("gloo-objects-sigterm-mixed")
    _, report = diagnose_form("gloo-objects-sigterm-mixed", "rank_*", 4)
    assert report["verdict"] == "problem"
    assert _first(report) == ("crashed", [fired["rank"]]), report["findings"]
    assert "SIGTERM" in report["findings"][0]["detail"]


def test_a_connection_closed_by_the_absent_peer_is_its_echo():
    fired = truth("gloo-tp-sigterm-mixed")
    _, report = diagnose_form("gloo-tp-sigterm-mixed", "rank_*", 4)
    assert _first(report) == ("missing_ranks", [fired["rank"]]), report["findings"]
    assert not any(f["kind"] == "crashed" for f in report["findings"]), report["findings"]


def test_a_skip_is_named_against_the_sibling_groups_when_gloo_aborted_the_peer():
    fired = truth("gloo-tp-skip-abort")
    assert (fired["kind"], fired["rank"]) == ("skip", 0)
    _, report = diagnose_form("gloo-tp-skip-abort", "rank_*.jsonl", 4)
    first = report["findings"][0]
    assert (first["kind"], first["ranks"]) == ("type_mismatch", [0]), report["findings"]
    assert "sibling groups" in first["detail"] and "left no trace" in first["detail"]


def test_lateness_every_tensor_parallel_group_shows_at_one_place_is_no_straggler():
    _, report = diagnose_form("gloo-tp-healthy-roles", "rank_*.jsonl", 4)
    assert report["verdict"] == "ok", report["findings"]


def _user_code_only(line: str) -> str:
    """A recorder dump line with its main thread's stack cut after the user's last frame."""
    doc = json.loads(line)
    for name, frames in (doc.get("stacks") or {}).items():
        if name.startswith("MainThread"):
            while frames and "site-packages/torch/" in frames[-1]["filename"]:
                frames.pop()
    return json.dumps(doc)


def test_a_recorder_only_rank_in_no_collective_at_all_is_absent_from_a_call_a_member_still_waits_in():
    """MoE, rank 1 stopped outside collectives (the drill sleeps in the optimizer's step hook), mixed forms:
    rank 1 left only the recorder's trace, which cannot see all_reduce #18 (placed as one issued from C++);
    rank 3 still waits in it. A rank whose main thread is outside torch is in no collective at all: had it issued
    #18, it would be in it or #18 would have completed on rank 3 too. With the stack as dumped (inside torch's
    optimizer wrapper: a C++-issued call is possible there) nothing says so; with the user's frames only, rank 1
    is the one #18 waits for."""
    fired = truth("gloo-moe-hang-mixed")
    assert (fired["kind"], fired["rank"]) == ("hang", 1)
    with tempfile.TemporaryDirectory() as d:
        for f in (FIXTURES / "gloo-moe-hang-mixed").glob("rank_*"):
            shutil.copy(f, Path(d) / f.name)
        rank_1 = Path(d) / "rank_1.jsonl"
        rank_1.write_text("".join(_user_code_only(line) + "\n" for line in rank_1.read_text().splitlines()))
        report = analyze(load_traces([d], world_size=4))
    first = report.findings[0]
    assert (first.kind, first.ranks) == ("missing_ranks", [1]), [(f.kind, f.ranks) for f in report.findings]


def test_a_dtype_changed_at_a_groups_first_call_is_named_against_the_siblings():
    """Tensor parallel, rank 3 retyped its first call on its data-parallel group; Gloo aborted its peer (no dump).
    No earlier call on the group to vouch that the siblings run its program, but the same collective at that
    place does, for a dtype (pipeline stages pass their own sizes, not their own dtypes): Flight Recorder's
    dumps alone name rank 3 (`gloo-tp-retype-first`)."""
    fired = truth("gloo-tp-retype-first")
    assert (fired["kind"], fired["rank"]) == ("retype", 3)
    _, report = diagnose_form("gloo-tp-retype-first", "rank_*.fr.pkl", 4)
    assert _first(report) == ("dtype_mismatch", [3]), report["findings"]


def test_an_error_a_rank_raised_of_its_own_in_the_call_decides_whose_sizes():
    """MoE, rank 2 resized its all_to_all_single input: the members' sizes do not add up, which alone cannot say
    whose ("one of ranks 0-3"); rank 2's own call raised torch's check of its split sizes, the others a lost
    connection. The rank whose call failed on its own arguments is the odd one (`gloo-moe-resize-split`)."""
    fired = truth("gloo-moe-resize-split")
    assert (fired["kind"], fired["rank"]) == ("resize", 2)
    _, report = diagnose_form("gloo-moe-resize-split", "rank_*.jsonl", 4)
    assert _first(report) == ("size_mismatch", [2]), report["findings"]
    assert "own call raised" in report["findings"][0]["detail"]
    assert "nothing in the traces says whose" not in report["findings"][0]["detail"]


def test_a_python_call_a_recorder_only_rank_never_recorded_is_one_it_never_issued():
    """DDP, 8 ranks, rank 5 skipped its loss all_reduce (a Python call), mixed forms: ranks 2 and 5 left only the
    recorder's trace. Rank 5, inside the next backward, was taken as probably inside the call (a recorder-only
    rank inside torch may be in a call issued from C++, which its trace cannot see), and the peer Gloo aborted
    led. The call is placed among the recorder's (rank 2 recorded it): rank 5's trace would show it
    (`gloo-ddp-skip-mixed`)."""
    fired = truth("gloo-ddp-skip-mixed")
    assert (fired["kind"], fired["rank"]) == ("skip", 5)
    _, report = diagnose_form("gloo-ddp-skip-mixed", "rank_*", 8)
    assert _first(report) == ("missing_ranks", [5]), report["findings"]


def test_a_retyped_call_of_the_one_flight_recorder_rank_is_placed_by_its_size():
    """DDP, rank 2 retyped its loss all_reduce, mixed forms: ranks 0 and 3 left the recorder's traces, rank 2
    alone Flight Recorder's JSON, so the Flight Recorder side of the alignment is rank 2's own calls, fault
    included. The recorder's call fitting no call of that dtype after its predecessors is placed by element
    count (trace/loaders/align_ranks.py), and the dtypes disagree where the fault is: rank 2, two against one
    (`gloo-ddp-retype-mixed`)."""
    fired = truth("gloo-ddp-retype-mixed")
    assert (fired["kind"], fired["rank"]) == ("retype", 2)
    _, report = diagnose_form("gloo-ddp-retype-mixed", "rank_*", 4)
    assert _first(report) == ("dtype_mismatch", [2]), report["findings"]


def test_lateness_by_role_is_judged_by_the_sibling_groups_these_dumps_can_time():
    """A healthy 8-rank tensor-parallel run, mixed forms: two of the four TP groups hold a recorder-only member,
    whose trace cannot time the DTensor calls; the groups that can be timed show the same place late, and that
    is enough (`gloo-tp8-healthy-mixed`)."""
    _, report = diagnose_form("gloo-tp8-healthy-mixed", "rank_*", 8)
    assert report["verdict"] == "ok", report["findings"]


def test_ranks_waiting_for_ranks_ended_on_their_way_are_explained_by_the_first_signal():
    """DCP, 8 ranks, rank 4 SIGTERMed between two calls; the launcher then ended five more ranks on their way to
    the all_gather three ranks waited in. Those five are consequences (ended.py), and the waits that end at them
    are explained by the first rank a signal ended, not by the five again (`gloo-dcp8-sigterm-first`)."""
    fired = truth("gloo-dcp8-sigterm-first")
    assert (fired["kind"], fired["rank"], fired["arg"]) == ("kill", 4, "SIGTERM")
    _, report = diagnose_form("gloo-dcp8-sigterm-first", "rank_*.jsonl", 8)
    assert _first(report) == ("crashed", [4]), report["findings"]
    assert "SIGTERM" in report["findings"][0]["detail"]


def test_a_retired_call_a_member_that_ended_never_issued_is_the_call_in_flight():
    """Tensor parallel, the launcher's SIGTERM ended rank 2 (recorder only) in its optimizer step, before its
    loss all_reduce; rank 0's Gloo dump marks that all_reduce retired (Gloo ended it when the connection closed)
    and rank 0 idle. No collective completes without every member: rank 0 was in it, waiting for rank 2, and its
    tensor-parallel call rank 1 waits in (retired too, and rank 0 held, never issued it) is a consequence
    (`gloo-tp-sigterm-retired`). Rank 2 is named for the signal that ended it: its last shared call, a
    tensor-parallel all_reduce only Flight Recorder times by arrival, dates its end (diagnose/ended.py)."""
    fired = truth("gloo-tp-sigterm-retired")
    assert (fired["kind"], fired["rank"], fired["arg"]) == ("kill", 2, "SIGTERM")
    _, report = diagnose_form("gloo-tp-sigterm-retired", "rank_*", 4)
    assert _first(report) == ("crashed", [2]) and "SIGTERM" in report["findings"][0]["detail"], report["findings"]
    assert report["ranks"]["0"]["pending"][0]["seq"] == 20, report["ranks"]["0"]
    assert report["retired_in_flight"] == [  # rank 1's, by rank 0 held in #20 in turn (completion.py)
        {"rank": 0, "group": "1", "seq": 20, "never_issued_by": 2},
        {"rank": 1, "group": "3", "seq": 9, "never_issued_by": 0, "member_waits_in": {"group": "1", "seq": 20}}]
    assert report["ranks"]["1"]["pending"][0]["seq"] == 9, report["ranks"]["1"]


def test_every_retirement_a_hung_members_final_trace_refutes_is_read_as_in_flight():
    """Object collectives, rank 2 (recorder only) hung outside collectives until the launcher ended it; the three
    Gloo dumps mark the next all_gather retired. Rank 2's main thread stood inside torch's optimizer, but its
    recorder shows every call of this group: it never issued the all_gather (`gloo-objects-hang-retired`)."""
    fired = truth("gloo-objects-hang-retired")
    assert (fired["kind"], fired["rank"]) == ("hang", 2)
    _, report = diagnose_form("gloo-objects-hang-retired", "rank_*", 4)
    assert _first(report)[1] == [2], report["findings"]
    assert sorted(x["rank"] for x in report["retired_in_flight"]) == [0, 1, 3]


def test_a_call_of_a_kind_the_recorder_always_saw_is_one_a_recorder_only_rank_never_issued():
    """Tensor parallel, rank 3 (recorder only) hung after its step; its data-parallel peer's Gloo dump holds one
    more loss all_reduce than rank 3's trace, after every call both hold. The recorder saw every loss all_reduce
    before: rank 3 never issued that one, not "unknown, issued from C++" (`gloo-tp-hang-tail`)."""
    fired = truth("gloo-tp-hang-tail")
    assert (fired["kind"], fired["rank"]) == ("hang", 3)
    _, report = diagnose_form("gloo-tp-hang-tail", "rank_*", 4)
    assert _first(report) == ("missing_ranks", [3]), report["findings"]
    first = report["findings"][0]
    assert (first["group"], first["seq"]) == ("2", 10), first


def test_a_scatter_received_into_another_size_is_named_in_every_form():
    """Tensor parallel, rank 1 received `parallelize_module`'s weight scatter into a buffer a row larger: Gloo
    completed the call, the job ran on and its loss went NaN. Every member of a scatter receives a chunk of one
    size, the root's: the recorder (roots recorded) names rank 1 by the root's size, Flight Recorder's dumps
    (no roots) by the sibling group's scatter at the same place (`gloo-tp-resize-scatter`)."""
    fired = truth("gloo-tp-resize-scatter")
    assert (fired["kind"], fired["rank"], fired["call"]["op"]) == ("resize", 1, "scatter")
    for pattern in ("rank_*.jsonl", "rank_*.fr.pkl"):
        _, report = diagnose_form("gloo-tp-resize-scatter", pattern, 4)
        assert _first(report) == ("size_mismatch", [1]), (pattern, report["findings"])


def test_a_rank_its_own_watchdog_saw_in_no_call_never_issued_the_call_others_wait_in():
    """DCP over DDP, 8 ranks, rank 3 (recorder only) hung between two steps; its stack, dumped before the drills
    kept their frame, ends inside torch's optimizer wrapper, where a C++-issued call cannot be ruled out. Its own
    watchdog, which reads the process's Flight Recorder, saw no call in flight (`this_rank.blocked_in` empty):
    it never issued the gradient all_reduce ranks 0 and 6 wait in. With the watchdog's look taken away, the
    stack alone cannot say so (`gloo-dcp8-hang-watched`)."""
    fired = truth("gloo-dcp8-hang-watched")
    assert (fired["kind"], fired["rank"]) == ("hang", 3)
    _, report = diagnose_form("gloo-dcp8-hang-watched", "rank_*", 8)
    assert _first(report) == ("missing_ranks", [3]), report["findings"]
    with tempfile.TemporaryDirectory() as d:
        for f in (FIXTURES / "gloo-dcp8-hang-watched").glob("rank_*"):
            shutil.copy(f, Path(d) / f.name)
        ts = load_traces([d], world_size=8)
        ts.ranks[3].hang["this_rank"]["blocked_in"] = {"group": "0", "seq": 20, "op": "all_reduce",
                                                        "source": "flight_recorder"}
        first = analyze(ts).findings[0]
    assert (first.kind, first.ranks) != ("missing_ranks", [3]), (first.kind, first.ranks, first.detail)


def test_lateness_whose_role_no_dump_can_time_is_no_finding():
    """A healthy 4-rank tensor-parallel job (2 x 2 mesh), mixed forms: rank 1 left only the recorder's trace, which
    cannot see the calls issued from C++, so its TP group's calls are not timed; rank 2 arrives 38 ms after rank 3
    at every all_reduce of theirs, by its role (`gloo-tp-healthy-untold`). With the sibling group untimed,
    nothing tells the rank from its place in the program: the lateness is reported apart (`unconfirmed`), and the
    verdict is OK. The same job's recorder dumps time the sibling and read OK by its role."""
    _, report = diagnose_form("gloo-tp-healthy-untold", "rank_*", 4)
    assert report["verdict"] == "ok" and not report["findings"], report["findings"]
    assert [(f["kind"], f["ranks"], f["evidence"]["role_untold"]) for f in report["unconfirmed"]] == [
        ("straggler", [2], True)], report["unconfirmed"]
