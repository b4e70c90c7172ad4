"""One fault-injection grammar, KIND:RANK[:ARG], for validate, the health monitor and parity: the same text means
the same fault in every command, each command refuses the kinds it cannot plant in one line, and the table in
docs/validate.md lists every kind."""

import re
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from distdoctor.errors import InputError
from distdoctor.health.inject import Injector, parse_injection
from distdoctor.health.parity import _parse_inject
from distdoctor.world.faults import HEALTH_KINDS, KINDS, PARITY_KINDS, RUN_KINDS, VALIDATE_KINDS, Fault, parse_fault

DOCS = Path(__file__).resolve().parents[2] / "docs" / "validate.md"


def test_every_kind_is_planted_by_some_command_and_documented_once():
    assert set(VALIDATE_KINDS) | set(HEALTH_KINDS) | set(PARITY_KINDS) | set(RUN_KINDS) == set(KINDS)
    table = re.findall(r"^\| `(\w+):R", DOCS.read_text(), re.MULTILINE)
    assert sorted(table) == sorted(KINDS), table  # one row per kind, none twice


def test_the_same_text_is_the_same_fault_everywhere():
    assert parse_injection("drift:2:fc2.weight") == parse_fault("drift:2:fc2.weight", HEALTH_KINDS) \
        == parse_fault("drift:2:fc2.weight", PARITY_KINDS) == Fault("drift", 2, "fc2.weight")
    assert parse_injection("slow:1") == Fault("slow", 1, 0.05)  # defaults come from the one table
    assert parse_injection("mem:0:600") == Fault("mem", 0, 600.0)
    assert parse_fault("crash:3") == Fault("crash", 3, 1)
    assert str(parse_fault("delay:2:0.5")) == "delay:2:0.5"


@pytest.mark.parametrize("text,kinds,why", [
    ("drift:1", VALIDATE_KINDS, "unknown kind 'drift' here (one of corrupt, delay, crash, skip); drift is planted "
                                "by the health monitor and parity"),
    ("crash:1", HEALTH_KINDS, "unknown kind 'crash' here (one of drift, nan, slow, mem); crash is planted by "
                              "validate, check and distdoctor run"),
    ("nan:1:fc2", PARITY_KINDS, "unknown kind 'nan' here (one of drift); nan is planted by the health monitor"),
    ("slow:x", HEALTH_KINDS, "RANK 'x' is not an integer"),
    ("mem:0:lots", HEALTH_KINDS, "MIB 'lots' is not a number"),
])
def test_a_command_refuses_what_it_cannot_plant_in_one_line(text, kinds, why):
    with pytest.raises(InputError) as exc:
        parse_fault(text, kinds)
    assert str(exc.value) == f"--inject {text}: {why}"


def test_drift_names_the_parameter_and_still_reads_parity_s_amount():
    first = {"rank": 1, "param": "0.weight", "amount": 1e-6}
    assert _parse_inject("drift:1", 2, seed=0) == first
    assert _parse_inject("drift:1:2.weight", 2, seed=0) == {**first, "param": "2.weight"}
    assert _parse_inject("drift:1:1e-9", 2, seed=0) == {**first, "amount": 1e-9}  # the older spelling
    with pytest.raises(InputError, match="no parameter named 'fc2.weight' .parameters: 0.weight, 0.bias"):
        _parse_inject("drift:1:fc2.weight", 2, seed=0)


def test_the_health_monitor_reads_drift_alike():
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    before = {n: p.detach().clone() for n, p in net.named_parameters()}
    Injector(parse_injection("drift:0:1.weight"), net, rank=0, at_step=0).after_step()  # one ulp of 1.weight
    moved = {n for n, p in net.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"1.weight"}
    assert torch.nextafter(before["1.weight"].view(-1)[0], torch.tensor(float("inf"))) == net[1].weight.view(-1)[0]
    Injector(parse_injection("drift:0:0.5"), net, rank=0, at_step=0).after_step()  # an amount: the first parameter
    assert float(net[0].weight.detach().view(-1)[0] - before["0.weight"].view(-1)[0]) == pytest.approx(0.5)
