"""Fuzz the simulator's IR parser (and the engine behind it) with mutated shipped example plans.

Property: `parse_text` returns a checked Program or raises InputError whose `what` starts with the file name
(and, for a bad op, names rank/stream/op); whatever parses simulates without raising.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from distdoctor.errors import InputError
from distdoctor.sim.ir import parse_text
from distdoctor.sim.result import simulate

from fuzz_inputs import damaged_bytes, json_text, mutated_structure

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "distdoctor" / "sim" / "examples"
# The two smallest shipped plans (the YAML parser is pure Python: big seeds would make each case slow).
SEEDS = {p.name: p.read_text() for p in sorted(EXAMPLES.glob("*.yaml"), key=lambda p: p.stat().st_size)[:2]}
SEED_OBJS = {name: yaml.safe_load(text) for name, text in SEEDS.items()}
SOURCE = "plan.yaml"


def _parse(text: str) -> None:
    try:
        prog = parse_text(text, SOURCE)
    except InputError as exc:
        assert exc.what.startswith(SOURCE) and exc.why and "\n" not in str(exc), str(exc)
        return
    simulate(prog)


def test_seeds_parse_and_run():
    for text in SEEDS.values():
        _parse(text)


# Nesting junk stops just past the recursion limit: PyYAML's scanner is quadratic in flow nesting and gives up at
# that limit, so deeper lists cost more per case and reach the same error (test_deeply_nested_yaml goes to 5000).
@given(st.sampled_from(sorted(SEED_OBJS)).flatmap(
    lambda n: mutated_structure(SEED_OBJS[n], allow_bytes=False, max_depth=1200)))
def test_mutated_plans(obj):
    text = json_text(obj)
    assume(text is not None)
    _parse(text)


@given(st.sampled_from(sorted(SEEDS)).flatmap(lambda n: damaged_bytes(SEEDS[n].encode())))
def test_damaged_plan_text(data):
    _parse(data.decode("utf-8", errors="replace"))


@given(st.sampled_from(["us", "bytes", "peer", "capacity", "alpha_us", "gbps"]),
       st.sampled_from([-1, 0, 10**30, 10**400, float("inf"), float("nan"), 1e308, "x", None, [], {}, True]))
def test_weird_numbers(field, value):
    obj = yaml.safe_load(SEEDS[sorted(SEEDS)[0]])

    def poke(node):
        if isinstance(node, dict):
            for k in list(node):
                if k == field:
                    node[k] = value
                else:
                    poke(node[k])
        elif isinstance(node, list):
            for x in node:
                poke(x)
    poke(obj)
    _parse(yaml.safe_dump(obj))


@pytest.mark.parametrize("depth", [10, 900, 1100, 5000])  # around Python's recursion limit; YAML is slow
def test_deeply_nested_yaml(depth):
    _parse("ranks: " + "[" * depth + "]" * depth)
