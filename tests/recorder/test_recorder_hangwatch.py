"""The hang rule on a recorder driven by hand (no torch, no processes): the adaptive threshold, suspected ->
confirmed -> resumed, the idle rule, requests from `distdoctor run`; then `diagnose`'s `hang` object merged
from the headers of several ranks, in the JSON and the text report."""

from __future__ import annotations

import time
from collections import deque
from types import SimpleNamespace

import pytest

from distdoctor.diagnose import hang_status
from distdoctor.diagnose.analyze import analyze
from distdoctor.report.diagnose_text import render_text
from distdoctor.recorder.hangwatch import HangWatch
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, dumps
from distdoctor.recorder import RecorderConfig


class Call(SimpleNamespace):
    __hash__ = object.__hash__


class FakeRecorder:
    def __init__(self, timeout=300.0, floor=10.0, factor=3.0):
        self.config = RecorderConfig("/nonexistent", timeout or None, suspect_floor=floor or None,
                                     suspect_factor=factor)
        self.pending: set = set()
        self.waits: deque = deque(maxlen=256)
        self.last_progress = 0.0
        self.rank = 2
        self.seq: dict = {}  # collectives issued per group (none yet: the rank is starting)
        self.p2p_seq: dict = {}

    def pending_summary(self) -> str:
        return f"{len(self.pending)} pending"

    def call(self, t: float, seq: int = 7):
        r = Call(t_created=t, group="0", op="all_reduce", seq=seq, p2p_seq=None)
        self.seq["0"] = seq
        self.pending.add(r)
        self.last_progress = t
        return r

    def done(self, r, t: float):
        self.pending.discard(r)
        self.last_progress = t
        self.waits.append(t - r.t_created)


def watch(rec) -> HangWatch:
    w = HangWatch(rec)
    w.fr.available = False  # no Flight Recorder without torch
    return w


def test_suspected_after_the_floor_then_resumed():
    rec = FakeRecorder()
    w = watch(rec)
    r = rec.call(100.0)
    assert w.tick(105.0) is None
    kind, reason = w.tick(110.5)
    assert kind == "dump"
    assert reason == ("hang suspected: all_reduce #7 on group 0 in flight for 10.5 s (threshold 10 s = "
                      "max(floor 10 s, 3 x longest recent wait 0.00 s))")
    h = w.header()
    assert h["status"] == "suspected" and h["detected_by"] == 2 and h["since"] == 100.0
    assert h["threshold_s"] == 10.0 and h["blocked_in"]["seq"] == 7 and h["this_rank"]["blocked_in"]["op"] == "all_reduce"
    assert w.tick(111.0) is None  # once per episode
    rec.done(r, 130.0)
    kind, reason = w.tick(131.0)
    assert kind == "rewrite" and reason.startswith("hang resumed: progress after 30.0 s (hang suspected at ")
    assert w.header()["status"] == "resumed" and w.header()["resumed_after_s"] == 30.0
    # the threshold learned from that wait: 3 x 30 s
    rec.call(200.0)
    assert w.tick(250.0) is None
    assert w.tick(290.5)[0] == "dump" and w.header()["threshold_s"] == 90.0


def test_threshold_follows_the_longest_recent_wait():
    rec = FakeRecorder()
    rec.waits.extend([0.01] * 100 + [5.0])
    w = watch(rec)
    rec.call(0.0)
    assert w.tick(14.9) is None
    assert w.tick(15.1)[0] == "dump"
    assert w.header()["recent_wait_s"] == 5.0 and w.header()["waits_seen"] == 101


def test_confirmed_after_the_hang_timeout_and_floor_above_timeout():
    rec = FakeRecorder(timeout=20.0)
    w = watch(rec)
    rec.call(100.0)
    assert w.tick(111.0)[0] == "dump"
    kind, reason = w.tick(121.0)
    assert kind == "dump" and reason == "hang: no collective completed for 21.0 s (hang timeout 20 s; 1 pending)"
    assert w.header()["status"] == "confirmed"
    assert w.tick(125.0) is None
    # a floor above the timeout: straight to confirmed
    rec2 = FakeRecorder(timeout=5.0, floor=10.0)
    w2 = watch(rec2)
    rec2.call(0.0)
    assert w2.tick(5.5)[1].startswith("hang: no collective completed for 5.5 s")
    assert w2.header()["status"] == "confirmed"


def test_idle_rank_is_confirmed_only_after_the_timeout():
    rec = FakeRecorder(timeout=20.0)
    rec.last_progress = 100.0
    rec.seq["0"] = 5  # past its start-up
    w = watch(rec)
    w.fr.available, w.fr.look = True, lambda now: (None, False, [])  # Flight Recorder on, showing nothing
    assert w.tick(115.0) is None  # nothing in flight: a pause outside collectives is never suspected
    kind, reason = w.tick(121.0)
    assert reason == "hang: no collective completed for 21.0 s (hang timeout 20 s; no collective pending)"
    assert w.header()["blocked_in"] is None and w.header()["this_rank"]["blocked_in"] is None
    assert w.tick(130.0) is None
    rec.last_progress = 131.0  # it issued something: resumed
    assert w.tick(131.5)[0] == "rewrite"


def test_without_flight_recorder_a_moving_main_thread_is_not_idle():
    """C++-issued collectives (DDP) are invisible then: the rule must not call a busy rank idle."""
    rec = FakeRecorder(timeout=20.0)
    rec.last_progress = 100.0
    rec.seq["0"] = 5
    w = watch(rec)
    assert w.tick(121.0) is None  # this (main) thread is running
    w._main_pos = w._main_still_since = None
    w._main_is_still = lambda now: True  # a main thread sitting in one call since 100
    w._main_still_since = 100.0
    assert w.tick(121.0)[1].startswith("hang: no collective completed for 21.0 s")


def test_no_timeout_no_rule_and_floor_zero_only_confirms():
    rec = FakeRecorder(timeout=0)
    w = watch(rec)
    rec.call(0.0)
    assert w.tick(10_000.0) is None
    rec = FakeRecorder(timeout=30.0, floor=0)
    w = watch(rec)
    rec.call(0.0)
    assert w.tick(29.0) is None and w.tick(31.0)[1].startswith("hang: no collective completed")


def test_requests_from_run_are_adopted_once():
    rec = FakeRecorder()
    w = watch(rec)
    episode = {"status": "suspected", "detected_by": 0, "detected_at": 50.0, "since": 40.0, "threshold_s": 10.0}
    assert w.adopt(episode) is True
    h = w.header()
    assert h["requested"] is True and h["detected_by"] == 0 and h["this_rank"]["blocked_in"] is None
    assert w.adopt(episode) is False  # already dumped for it
    assert w.adopt({**episode, "status": "confirmed"}) is True
    own = watch(FakeRecorder())
    own.rec.call(0.0)
    own.tick(11.0)
    assert own.adopt(episode) is False  # it detected the hang itself


class ScriptedFlightRecorder:
    """Flight Recorder as the hang rule sees it: what is in flight, and a state that changes when the rank's C++ side
    issues or completes something (a look says only whether it changed since the last look)."""

    def __init__(self, flight=None):
        self.available, self.seen_any, self.flight, self.state, self._seen = True, True, flight, 0, None
        self.looks: list[float] = []

    def look(self, now):
        self.looks.append(now)
        moved = self._seen is not None and self._seen != self.state
        self._seen = self.state
        return self.flight, moved, []


def test_a_look_older_than_the_episode_is_no_resume():
    """The rank's last look at Flight Recorder was before the stall; run asks it to join an episode; the next look
    sees what moved before the stall (the calls issued then): that is no progress after the episode opened."""
    now = time.time()
    rec = FakeRecorder(timeout=12.0, floor=2.0)
    rec.seq["0"] = 9
    rec.last_progress = now - 30.0
    w = HangWatch(rec)
    w.fr = fr = ScriptedFlightRecorder()
    w._rebase(now - 10.0)  # a look before the stall
    fr.state, fr.flight = 1, {"since": now - 4.0, "group": "3", "op": "all_reduce", "seq": 7,
                              "source": "flight_recorder"}  # then its C++ side issued calls and blocked
    episode = {"status": "suspected", "detected_by": 0, "detected_at": now - 1.0, "since": now - 4.2}
    assert w.adopt(episode) is True and fr.looks[-1] >= now  # joined on a fresh look
    assert w.tick(now + 1.0) is None and w.episode["status"] == "suspected"  # no resume
    kind, reason = w.tick(now + 9.0)
    assert kind == "dump" and w.episode["status"] == "confirmed", reason
    fr.state = 2  # it moved after the episode opened: that is a resume
    assert w.tick(now + 10.0)[0] == "rewrite" and w.episode["status"] == "resumed"


def test_a_hang_is_called_on_a_fresh_look():
    """The call a stale look showed in flight completed since: looked at again, no hang is opened."""
    now = time.time()
    rec = FakeRecorder(timeout=12.0, floor=2.0)
    rec.seq["0"] = 9
    rec.last_progress = now - 30.0
    w = HangWatch(rec)
    w.fr = fr = ScriptedFlightRecorder({"since": now - 5.0, "group": "3", "op": "all_reduce", "seq": 7,
                                        "source": "flight_recorder"})
    w._rebase(now - 1.5)
    fr.state, fr.flight = 1, None
    assert w.tick(now) is None and w.episode is None and fr.looks[-1] == now


class FakeStore:
    """The job's store, as the ranks use it to say they issued their first collective."""

    def __init__(self, keys=()):
        self.keys = set(keys)

    def set(self, key, value):
        self.keys.add(key)

    def check(self, keys):
        return all(k in self.keys for k in keys)


def starting(store, start_timeout=60.0):
    rec = FakeRecorder(timeout=12.0, floor=2.0)
    rec.config.start_timeout, rec.world_size = start_timeout, 4
    w = watch(rec)
    w.fr.available, w.fr.look = True, lambda now: (None, False, [])  # the idle rule applies with Flight Recorder
    w.store = lambda: store
    return rec, w


def test_start_up_is_held_to_the_start_timeout():
    """Until every rank has issued its first collective (one may still be importing torch), a rank that has issued
    nothing, and a wait, are not hung after the hang timeout: confirmed after the start timeout, and said so."""
    rec, w = starting(FakeStore())
    rec.last_progress = 100.0
    assert w.tick(130.0) is None  # idle for 30 s, but no collective issued yet
    kind, reason = w.tick(160.5)
    assert kind == "dump" and reason.startswith("hang: during start-up: no collective issued for 60.5 s"), reason
    assert w.header()["start_up"] is True and w.header()["start_timeout_s"] == 60.0
    # blocked in a collective while rank 3 has issued none: not suspected at the floor nor at the hang timeout
    store = FakeStore({"distdoctor/started/0", "distdoctor/started/1"})
    rec, w = starting(store)
    rec.call(200.0, seq=1)
    assert w.tick(205.0) is None and "distdoctor/started/2" in store.keys  # this rank said it has started
    assert w.tick(212.5) is None and w.tick(259.0) is None
    kind, reason = w.tick(260.5)
    assert kind == "dump" and w.header()["status"] == "confirmed" and w.header()["start_up"] is True
    assert reason == ("hang: during start-up: all_reduce #1 on group 0 in flight for 60.5 s, and a rank of the job "
                      "has issued no collective yet (start timeout 60 s)"), reason


def test_once_every_rank_started_a_first_call_is_a_hang_like_any_other():
    """A rank that skipped a group's first call, two ranks that both receive first: every rank has issued a
    collective, so the hang timeout holds; and --start-timeout 0 holds start-up to it too."""
    rec, w = starting(FakeStore({f"distdoctor/started/{r}" for r in range(4)}))
    rec.call(300.0, seq=1)
    assert w.tick(302.5)[1].startswith("hang suspected: all_reduce #1") and "start_up" not in w.header()
    rec, w = starting(FakeStore(), start_timeout=0.0)
    rec.call(300.0, seq=1)
    assert w.tick(302.5)[1].startswith("hang suspected: all_reduce #1") and "start_up" not in w.header()
    rec, w = starting(None)  # no store to ask: counted as started
    rec.call(300.0, seq=1)
    assert w.tick(302.5)[1].startswith("hang suspected: all_reduce #1")


# ---- diagnose's `hang` object ----------------------------------------------------------------------------------

def _trace(rank, hang, entries, stacks=None):
    return RankTrace(rank=rank, source="native", world_size=3, groups={"0": GroupInfo("0", [0, 1, 2])},
                     entries=entries, stacks=stacks, dump_reason="x", dump_time=111.0, hang=hang)


def _ar(seq, state, t):
    return Entry(index=seq, group="0", op="all_reduce", seq=seq, in_sizes=[[8]], out_sizes=[[8]],
                 in_dtypes=["float32"], out_dtypes=["float32"], state=state, t_created=t)


EPISODE = {"status": "suspected", "id": "h:1:1", "detected_by": 0, "detected_at": 110.0, "since": 100.0,
           "hang_timeout_s": 300.0, "threshold_s": 10.0, "floor_s": 10.0, "factor": 3.0, "recent_wait_s": 0.02,
           "waits_seen": 40, "blocked_in": {"group": "0", "seq": 2, "op": "all_reduce", "source": "recorder",
                                            "since": 100.0}, "requested": False}


def _set(tmp_path, hang0, hang1):
    blocked = {"blocked_in": EPISODE["blocked_in"], "blocked_for_s": 11.0, "idle_for_s": 11.0}
    traces = [
        _trace(0, {**hang0, "this_rank": blocked}, [_ar(1, "completed", 90.0), _ar(2, "started", 100.0)]),
        _trace(1, {**hang1, "this_rank": {"blocked_in": None, "blocked_for_s": None, "idle_for_s": 20.0}},
               [_ar(1, "completed", 90.0)],
               stacks={"MainThread (1)": [Frame("<module>", "/job/train.py", 9), Frame("load", "/job/train.py", 30)]}),
        _trace(2, None, [_ar(1, "completed", 90.0), _ar(2, "started", 100.5)]),
    ]
    for t in traces:
        (tmp_path / f"rank_{t.rank}.jsonl").write_text(dumps(t))
    return load_traces([str(tmp_path)])


def test_hang_object_merges_the_ranks_headers(tmp_path):
    ts = _set(tmp_path, EPISODE, {**EPISODE, "requested": True})
    h = hang_status.summarize(ts)
    assert h["status"] == "suspected" and h["blocked_for_s"] == 11.0 and h["threshold_s"] == 10.0
    assert h["threshold"]["derived"] == "max(floor 10 s, 3 x longest recent collective wait 0.02 s)"
    assert (h["blocked_ranks"], h["idle_ranks"], h["not_dumped"]) == ([0], [1], [2])
    assert h["now"] == {"1": "load (/job/train.py:30)"} and h["detected_by"] == 0
    report = analyze(ts)
    assert report.to_json()["hang"] == h
    line = next(ln for ln in render_text(report).splitlines() if ln.startswith("hang: "))
    assert line.startswith("hang: suspected: rank 0 blocked up to 11.0 s in all_reduce #2 on the default group '0'")
    assert "rank 1 in no collective (rank 1 now at load (/job/train.py:30))" in line
    assert "rank 2 did not dump for it" in line and "threshold 10 s = max(floor 10 s" in line


def test_hang_object_says_resumed_and_confirmed(tmp_path):
    resumed = {**EPISODE, "status": "resumed", "resumed_at": 131.0, "resumed_after_s": 31.0}
    h = hang_status.summarize(_set(tmp_path, resumed, {**EPISODE, "requested": True}))
    assert h["status"] == "resumed" and h["resumed_after_s"] == 31.0
    assert hang_status.describe(h).startswith("resumed after 31.0 s")
    h = hang_status.summarize(_set(tmp_path, {**EPISODE, "status": "confirmed"}, EPISODE))
    assert h["status"] == "confirmed" and "no progress for the hang timeout (300 s)" in hang_status.describe(h)


def test_no_hang_headers_no_hang_object(tmp_path):
    ts = _set(tmp_path, EPISODE, EPISODE)
    for t in ts.ranks.values():
        t.hang = None
    assert hang_status.summarize(ts) is None
    assert analyze(ts).to_json()["hang"] is None


@pytest.mark.parametrize("bad", [[1, 2], "suspected", {"status": "panicking"}])
def test_odd_hang_headers_are_ignored(tmp_path, bad):
    t = _trace(0, None, [_ar(1, "completed", 1.0)])
    text = dumps(t).splitlines()
    import json

    header = json.loads(text[0])
    header["hang"] = bad
    (tmp_path / "rank_0.jsonl").write_text("\n".join([json.dumps(header), *text[1:]]) + "\n")
    ts = load_traces([str(tmp_path)])
    assert hang_status.summarize(ts) is None


def test_a_collective_completed_with_the_whole_world_proves_the_job_started():
    """A rank stopped early in training (SIGSTOP at step 3) may never have marked itself started in the store; a
    collective this rank completed on a group of the whole world proves every rank issued one: the hang timeout
    holds, not the start timeout (the chaos drills had waited 600 s for it)."""
    from types import SimpleNamespace

    rec, w = starting(FakeStore({"distdoctor/started/0", "distdoctor/started/1", "distdoctor/started/2"}))
    rec.world_size = 4
    rec.groups = {"pg": ("0", [0, 1, 2, 3], "default_pg"), "sub": ("1", [2, 3], "")}
    rec.buffer = [SimpleNamespace(group="1", state="completed", seq=1)]
    assert w._job_started() is False  # a subgroup's completion proves only its members
    rec.buffer.append(SimpleNamespace(group="0", state="completed", seq=1))
    assert w._job_started() is True


def test_a_rank_says_every_member_of_a_group_it_completed_a_call_on_has_started():
    """A peer stopped before its own watchdog spoke is still marked started by the ranks that completed a
    collective with it (a tensor-parallel job: no rank's own groups cover the world)."""
    from types import SimpleNamespace

    store = FakeStore()
    rec, w = starting(store)
    rec.world_size = 4
    rec.groups = {"tp": ("1", [2, 3], ""), "dp": ("2", [0, 2], "")}
    rec.buffer = [SimpleNamespace(group="1", state="completed", seq=1)]
    rec.call(100.0, seq=1)
    w._mark_started(100.5)
    assert {"distdoctor/started/2", "distdoctor/started/3"} <= store.keys
    assert "distdoctor/started/0" not in store.keys  # the dp group completed nothing here
