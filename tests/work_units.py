"""How the suite is spread over two cores (pytest-xdist; pyproject's addopts: `-n 2 --dist loadgroup`).

Most of the suite's time is real jobs waiting for a hang to be detected, so two workers halve its wall time on two
cores. A work unit is a whole test file, so that its module fixtures run once; files that share a session fixture
of this tree (real_jobs, scenario_dumps, the multi-host ones) are one unit, because a session fixture runs once
per worker: on one worker it runs once. Units start largest first (by their time in a sequential run), so that
no long file starts last and keeps one core busy while the other idles.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# Seconds each unit took in a sequential run (2 cores, 2026-11-28, `--durations=0`). Only their order matters; units
# not listed start after these, in collection order. A stale figure costs balance, never a result.
UNIT_SECONDS = {
    "netns_ok+scenarios": 172, "real_jobs": 132, "tests/recorder/test_recorder_chaos.py": 102,
    "tests/recorder/test_recorder_inject.py": 96, "tests/fuzz/test_fuzz_jobs.py": 67,
    "tests/recorder/test_live.py": 53, "tests/foundation/test_lab05_notebook.py": 51, "scenario_dumps": 43,
    "tests/recorder/test_recorder_run_hangs.py": 42, "tests/foundation/test_check_blame.py": 36,
    "tests/fuzz/test_fuzz_hostile.py": 27, "tests/foundation/test_world_torchrun.py": 24,
    "tests/foundation/test_world_runjob.py": 23, "tests/recorder/test_recorder_stragglers.py": 21,
    "tests/foundation/test_validate_world.py": 20, "tests/health/test_health_faults.py": 20,
    "tests/foundation/test_launcher_output.py": 20, "tests/recorder/test_recorder_dumps.py": 19,
    "tests/health/test_health_parity.py": 17, "tests/recorder/test_recorder_ties.py": 17,
    "tests/foundation/test_first_run.py": 17, "tests/foundation/test_world_cli.py": 16,
}


def shared_fixtures(item) -> set[str]:
    """The session-scoped fixtures defined in this tree (not in a plugin) that the item uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {name for name, defs in info.name2fixturedefs.items()
            if defs and defs[-1].scope == "session" and TESTS in Path(inspect.getfile(defs[-1].func)).parents}


def _file(item) -> str:
    return item.nodeid.split("::", 1)[0]


def work_units(items) -> dict[str, str]:
    """{test file: its work unit}: the file itself, or the "+"-joined names of the shared session fixtures it uses
    (files sharing one of them, directly or through a third file, are one unit)."""
    uses: dict[str, set[str]] = {}
    for item in items:
        uses.setdefault(_file(item), set()).update(shared_fixtures(item))
    together = {name: {name} for used in uses.values() for name in used}
    for used in uses.values():
        merged = set().union(*(together[name] for name in used))
        for name in merged:
            together[name] = merged
    return {path: "+".join(sorted(together[min(used)])) if used else path for path, used in uses.items()}


def mark_groups(items: list) -> None:
    """On a worker: mark the tests of a unit of several files with its xdist_group (xdist appends it to their ids,
    which is how the scheduler, which collects nothing itself, sees the unit)."""
    units = work_units(items)
    for item in items:
        if units[_file(item)] != _file(item):
            item.add_marker(pytest.mark.xdist_group(units[_file(item)]))


def unit_of(nodeid: str) -> str:
    """The unit of a test as the scheduler sees it: its xdist_group, which xdist appends to the test's id after an @
    (a parameter may hold an @ too), else its file."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    return nodeid.split("::", 1)[0]


def start_order(collection: list[str]) -> list[str]:
    """The units of the collected test ids in the order they are handed out: largest first, the rest in
    collection order."""
    first: dict[str, int] = {}
    for i, nodeid in enumerate(collection):
        first.setdefault(unit_of(nodeid), i)
    return sorted(first, key=lambda unit: (-UNIT_SECONDS.get(unit, 0), first[unit]))


def scheduler(config, log):
    """`--dist loadgroup`, except that a test without an xdist_group mark goes with its file (as under
    `--dist loadfile`) rather than alone, and that units are handed out in start_order (xdist's own order is by
    number of tests, which puts the many quick parametrized cases of a file first)."""
    from xdist.scheduler import LoadGroupScheduling

    class FileOrGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            if not getattr(self, "ordered", False):  # the first call: the queue has just been built
                queue = dict(self.workqueue)
                self.workqueue.clear()
                self.workqueue.update((unit, queue[unit]) for unit in start_order(self.collection) if unit in queue)
                self.ordered = True
            super()._assign_work_unit(node)

    return FileOrGroupScheduling(config, log)
