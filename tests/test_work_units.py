"""The suite's work units under pytest-xdist (work_units.py): files sharing a session fixture of this tree are
one unit, so that fixture runs once; a plugin's session fixture or a module fixture groups nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from work_units import UNIT_SECONDS, mark_groups, start_order, unit_of, work_units


def session_one():  # stand-ins for fixture functions defined in this tree (pytest.approx: in a plugin)
    pass


def session_two():
    pass


def module_one():
    pass


class Item:
    """What work_units reads of a pytest item: its id, the definitions of its fixtures, add_marker."""

    def __init__(self, nodeid: str, fixtures: dict, marked: list):
        self.nodeid, self.marked = nodeid, marked
        defs = {name: (SimpleNamespace(scope=scope, func=func),) for name, (scope, func) in fixtures.items()}
        self._fixtureinfo = SimpleNamespace(name2fixturedefs=defs)

    def add_marker(self, mark) -> None:
        self.marked.append((self.nodeid, mark.name, mark.args))


def item(nodeid: str, marked: list | None = None, **fixtures) -> Item:
    return Item(nodeid, fixtures, [] if marked is None else marked)


ONE, TWO = ("session", session_one), ("session", session_two)


def test_files_sharing_a_session_fixture_of_the_tree_are_one_unit_and_through_a_third_file_too():
    items = [item("tests/a.py::t", one=ONE), item("tests/b.py::t[x]"), item("tests/b.py::t[y]", one=ONE, two=TWO),
             item("tests/c.py::t", two=TWO), item("tests/d.py::t", plugins=("session", pytest.approx)),
             item("tests/e.py::t", mod=("module", module_one)), item("tests/f.py::t", one=ONE)]
    assert work_units(items) == {"tests/a.py": "one+two", "tests/b.py": "one+two", "tests/c.py": "one+two",
                                 "tests/f.py": "one+two", "tests/d.py": "tests/d.py", "tests/e.py": "tests/e.py"}


def test_units_start_largest_first_then_in_collection_order():
    big, bigger = sorted((u for u in UNIT_SECONDS if u.endswith(".py")), key=UNIT_SECONDS.get)[-2:]
    collection = ["tests/small.py::t1", "tests/a.py::t1@one", f"{big}::t1", "tests/small.py::t2", "tests/b.py::t2@one",
                  f"{bigger}::t[x@y]", "tests/late.py::t"]
    assert start_order(collection) == [bigger, big, "tests/small.py", "one", "tests/late.py"]


def test_only_the_tests_of_a_unit_of_several_files_are_marked_with_its_group():
    marked: list = []
    items = [item("tests/a.py::t1", marked, one=ONE), item("tests/a.py::t2", marked),
             item("tests/b.py::t", marked, one=ONE), item("tests/c.py::t", marked, mod=("module", module_one))]
    mark_groups(items)
    assert marked == [("tests/a.py::t1", "xdist_group", ("one",)), ("tests/a.py::t2", "xdist_group", ("one",)),
                      ("tests/b.py::t", "xdist_group", ("one",))]


@pytest.mark.parametrize("nodeid, unit", [("tests/a.py::t[hang:2@step=3]", "tests/a.py"),
                                          ("tests/a.py::t[x@y]@real_jobs", "real_jobs"),
                                          ("tests/a.py::t@one+two", "one+two"), ("tests/a.py::C::t", "tests/a.py")])
def test_the_scheduler_keeps_a_file_together_and_a_group_together(nodeid, unit):
    assert unit_of(nodeid) == unit
