"""A live answer's trace as one object (model.to_object / from_object), read back checked as a dump file is, and
the ranks whose stacks a verdict asks for (live.single_out)."""

import json

import pytest

from distdoctor.diagnose import live
from distdoctor.trace import model
from distdoctor.trace.loaders.native import load_native_object


def _trace() -> model.RankTrace:
    f = [model.Frame("train_step", "/job/train.py", 41), model.Frame("<module>", "/job/train.py", 60)]
    entries = [model.Entry(index=i, group="0", op="all_reduce", seq=i, raw_op="all_reduce", in_sizes=[[8]],
                           out_sizes=[[8]], in_dtypes=["float32"], out_dtypes=["float32"], reduce_op="sum",
                           state="completed" if i < 3 else "started", t_created=10.0 + i, frames=f)
               for i in range(1, 4)]
    entries.append(model.Entry(index=4, group="1", op="send", p2p_seq=1, peer=2, in_sizes=[[2, 3]],
                               in_dtypes=["bfloat16"], frames=[f[1]]))
    return model.RankTrace(rank=1, source="native", version="1", world_size=4,
                           groups={"0": model.GroupInfo("0", [], False, "default_pg"),
                                   "1": model.GroupInfo("1", [1, 2], False, "pp")},
                           entries=entries, stacks={"MainThread (7)": f}, dump_reason=model.LIVE_REASON,
                           dump_time=20.0, host="node0", pid=7, hang={"status": "suspected"})


def test_object_form_round_trip_equals_the_text_form():
    t = _trace()
    obj = json.loads(json.dumps(model.to_object(t)))
    assert len(obj["frames"]) == 2  # each distinct frame once
    back = load_native_object(obj, "live:x#rank1")
    text = model.loads(model.dumps(t))
    assert back.entries == text.entries and back.stacks == text.stacks and back.groups == text.groups
    assert (back.rank, back.world_size, back.host, back.pid, back.hang) == (1, 4, "node0", 7, {"status": "suspected"})
    assert len(json.dumps(obj)) < len(model.dumps(t))


@pytest.mark.parametrize("damage, reason", [
    (lambda o: o["entries"][0].update(frames=[5]), "not indices into its frames"),
    (lambda o: o["entries"][0].update(frames=[True]), "not indices into its frames"),
    (lambda o: o["entries"][1].update(state="maybe"), "entry 1 (line 3): state 'maybe'"),
    (lambda o: o["entries"][0].update(seq=1 << 70), "beyond a 64-bit integer"),
    (lambda o: o["entries"][0].update(colour="red"), "malformed distdoctor trace (TypeError"),
    (lambda o: o.update(version=9), "unsupported distdoctor-trace version 9"),
    (lambda o: o.update(frames=[["f", "x.py"]]), "malformed distdoctor trace"),
])
def test_damaged_object_is_one_reason(damage, reason):
    obj = json.loads(json.dumps(model.to_object(_trace())))
    damage(obj)
    with pytest.raises(ValueError, match=None) as got:
        load_native_object(obj, "live:x#rank1")
    assert reason in str(got.value) and "\n" not in str(got.value)


def test_traceset_names_the_rank_whose_answer_does_not_load():
    job = live.Job("127.0.0.1", 1, 2, {r: live.Rank(r, f"http://10.0.0.{r}:5", served=True) for r in range(2)})
    good = model.to_object(_trace())
    bad = json.loads(json.dumps(good))
    bad["entries"][0]["frames"] = [99]
    answers = {0: live.Answer(0, state={"trace_object": {**good, "rank": 0}, "hang": {"status": "suspected"}}),
               1: live.Answer(1, state={"trace_object": bad})}
    ts = live.traceset(job, answers)
    assert list(ts.ranks) == [0] and ts.ranks[0].hang == {"status": "suspected"}
    assert [e.path for e in ts.errors] == ["live:http://10.0.0.1:5#rank1"]


def _answer(rank: int, issued: int, completed: int) -> live.Answer:
    return live.Answer(rank, state={"progress": {"0": {"issued": issued, "completed": completed},
                                                 "1": {"issued": 5, "completed": 5}}})


def test_single_out_names_every_rank_off_the_common_frontier_and_one_of_each_class():
    answers = {r: _answer(r, 100, 99) for r in range(64)}
    answers[17] = _answer(17, 99, 99)  # stopped short: in no collective
    answers[40] = _answer(40, 101, 100)  # went ahead
    answers[41] = live.Answer(41)  # its Python did not answer: py-spy is asked instead
    assert live.single_out(answers) == {0, 17, 40}
    split = {r: _answer(r, 100 + r % 2, 99) for r in range(10)}  # two classes of five
    assert live.single_out(split) == {0, 1, 3, 5, 7, 9} or live.single_out(split) == {0, 1, 2, 4, 6, 8}
    assert len(live.single_out({r: _answer(r, r, r) for r in range(1000)}, limit=256)) == 256
