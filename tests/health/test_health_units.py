"""In-process tests of the health checks' pure parts and of NaN-origin hooks on a single process."""

import math

import pytest
import torch
import torch.nn as nn

from distdoctor.errors import InputError
from distdoctor.health import fingerprint as fp
from distdoctor.health.events import EventSink, HealthEvent, read_events
from distdoctor.health.inject import Injector, parse_injection
from distdoctor.health.memory import imbalance
from distdoctor.health.monitor import HealthMonitor
from distdoctor.health.stragglers import straggler_scores
from distdoctor.health.trend import loss_trend


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_fingerprint_sees_one_ulp(dtype):
    t = torch.randn(1000, dtype=torch.float64).to(dtype)
    base = fp.tensor_fingerprint(t)
    for i in (0, 517, 999):
        u = t.clone()
        u[i] = torch.nextafter(u[i], torch.tensor(math.inf, dtype=dtype))
        assert fp.tensor_fingerprint(u) != base
    assert fp.tensor_fingerprint(t.clone()) == base
    # order-independent: the same bytes summed in another order give the same fingerprint
    assert fp.tensor_fingerprint(t.flip(0)) == base


def test_chunk_cursor_covers_everything_round_robin():
    named = [("a", torch.zeros(3 * fp.CHUNK + 5)), ("b", torch.zeros(10))]
    cur = fp.ChunkCursor(budget=2 * fp.CHUNK)
    seen = [cur.next(named) for _ in range(3)]
    assert seen[0] == [(0, 0, fp.CHUNK), (0, fp.CHUNK, 2 * fp.CHUNK)]
    assert seen[1] == [(0, 2 * fp.CHUNK, 3 * fp.CHUNK), (0, 3 * fp.CHUNK, 3 * fp.CHUNK + 5), (1, 0, 10)]
    assert seen[2] == seen[0]
    assert fp.ChunkCursor().next([("x", torch.zeros(7)), ("y", torch.zeros(0))]) == [(0, 0, 7), (1, 0, 0)]


def test_compare_names_first_tensor_and_minority():
    same = torch.tensor([1, 3, 5])
    odd = torch.tensor([1, 4, 6])
    diff = fp.compare([same, same, odd, same], ["a", "b", "c"], [0, 1, 2, 3])
    assert diff["name"] == "b" and diff["ranks"] == [2] and diff["majority"] and diff["count"] == 2
    tie = fp.compare([same, odd], ["a", "b", "c"], [4, 6])
    assert tie["ranks"] == [4, 6] and not tie["majority"]
    assert fp.compare([same, same], ["a", "b", "c"], [0, 1]) is None


def test_optimizer_state_is_fingerprinted():
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    names = [n for n, _ in fp.state_tensors(model, opt)]
    assert "optimizer:weight.exp_avg" in names and "optimizer:bias.exp_avg_sq" in names


def test_loss_trend_numbers():
    assert loss_trend([1.0 - 0.01 * i for i in range(50)]) is None  # falling: healthy
    rising = loss_trend([1.0 + 0.01 * i for i in range(50)])
    assert rising["kind"] == "loss_rising" and rising["relative_change"] == pytest.approx(0.49 / 1.245, rel=1e-6)
    assert "rose +39.4%" in rising["detail"]
    flat = loss_trend([2.302585] * 40)
    assert flat["kind"] == "loss_flat" and "2.30258" in flat["detail"]
    noisy = [1.0 + 0.05 * math.sin(i * 1.7) for i in range(60)]  # noise around a level: neither
    assert loss_trend(noisy) is None
    assert loss_trend([1.0, math.nan, 1.0, 1.0, 1.0]) is None


def test_straggler_scores_use_other_ranks_as_reference():
    res = straggler_scores({0: [0.010] * 20, 1: [0.030] * 20, 2: [0.011] * 20})
    assert res["flagged"] == [1]
    assert res["score"][1] == pytest.approx(0.0105 / 0.030)
    assert straggler_scores({0: [0.010] * 4, 1: [0.030] * 4})["flagged"] == []  # too few samples
    assert straggler_scores({0: [0.010] * 20, 1: [0.012] * 20})["flagged"] == []  # within threshold


def test_memory_imbalance_two_ranks():
    mib = 2**20
    assert imbalance({0: 300 * mib, 1: 700 * mib})["flagged"] == [1]
    assert imbalance({0: 300 * mib, 1: 310 * mib})["flagged"] == []


def test_event_sink_once_per_problem(tmp_path):
    sink = EventSink(tmp_path / "ev.jsonl")
    ev = HealthEvent("straggler", 5, [1], "slow")
    assert sink.emit(ev) and not sink.emit(HealthEvent("straggler", 9, [1], "slow again"))
    sink.rearm("straggler")
    assert sink.emit(HealthEvent("straggler", 20, [1], "slow again"))
    assert [e["step"] for e in read_events(tmp_path / "ev.jsonl")] == [5, 20]


class _NaNGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * math.nan


class BadGrad(nn.Module):
    def forward(self, x):
        return _NaNGrad.apply(x)


class Net(nn.Module):
    def __init__(self, bad_backward=False):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)
        self.bad = BadGrad() if bad_backward else nn.Identity()

    def forward(self, x):
        return self.fc3(self.bad(self.fc2(torch.relu(self.fc1(x)))))


def _train(model, steps, injector=None, loss_scale=1.0, every=100, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = HealthMonitor(model, opt, every=every, **kw)
    for step in range(steps):
        loss = model(torch.ones(3, 4)).sum() * loss_scale
        opt.zero_grad()
        loss.backward()
        opt.step()
        if injector:
            injector.after_step()
        mon.step(loss)
    mon.check()
    return mon


def test_nan_origin_forward_names_layer_and_step():
    model = Net()
    mon = _train(model, 6, Injector(parse_injection("nan:0:fc2"), model, rank=0, at_step=2))
    (ev,) = [e for e in mon.events if e.kind == "nonfinite"]
    assert (ev.step, ev.ranks, ev.subject, ev.data["phase"]) == (2, [0], "fc2", "forward")


def test_nan_origin_backward_names_module():
    mon = _train(Net(bad_backward=True), 3, nan_hooks="always")
    (ev,) = [e for e in mon.events if e.kind == "nonfinite"]
    # gradient finite at bad's output, NaN at fc2's output: bad's backward made it
    assert (ev.step, ev.data["phase"], ev.subject, ev.data["between"]) == (0, "backward", "bad", ["fc2", "bad"])


def test_nan_origin_backward_found_by_sentinel_one_step_later():
    mon = _train(Net(bad_backward=True), 3)  # default: sentinel + replay
    (ev,) = [e for e in mon.events if e.kind == "nonfinite"]
    # fc1 and fc2 got NaN gradients at step 0 (fc3 did not): seen as parameters at step 1, reported at step 0
    assert (ev.step, ev.data["phase"], ev.subject, ev.data["between"]) == (0, "update", "bad", ["fc2", "bad"])


def test_nan_origin_backward_with_parameter_gradients():
    mon = _train(Net(bad_backward=True), 3, param_grads=True)
    (ev,) = [e for e in mon.events if e.kind == "nonfinite"]
    # the gradient at fc2's output is checked before fc2's backward makes its parameter gradients
    assert (ev.subject, ev.data["parameter"], ev.data["between"]) == ("bad", "", ["fc2", "bad"])
    assert mon.nan is not None and any(h for h in mon.nan._handles)


def test_nan_origin_loss():
    mon = _train(Net(), 2, loss_scale=math.inf)
    (ev,) = [e for e in mon.events if e.kind == "nonfinite"]
    assert ev.data["phase"] == "loss" and ev.step == 0


def test_bad_injection_specs():
    for spec, why in [("boom:1", "unknown kind"), ("nan:x:fc1", "RANK"), ("nan:1", "layer name"),
                      ("slow:0:-1", "positive")]:
        with pytest.raises(InputError, match=why):
            parse_injection(spec)
    with pytest.raises(InputError, match="does not exist"):
        parse_injection("drift:4", world_size=2)
    with pytest.raises(InputError, match="no layer named 'fc9'"):
        Injector(parse_injection("nan:0:fc9"), Net(), rank=0)
