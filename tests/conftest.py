import inspect
import os
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")

# Worker processes and CLI subprocesses must import this checkout's distdoctor, not another install.
if SRC not in sys.path:
    sys.path.insert(0, SRC)
os.environ["PYTHONPATH"] = SRC + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")


@pytest.fixture
def cli_env():
    """Environment for running `python -m distdoctor` in a subprocess."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


# ---- the suite on two cores (pytest-xdist; pyproject's addopts: `-n 2 --dist loadgroup`) ---------------------------
# Most of the suite's time is real jobs waiting for a hang to be detected, so two workers halve the wall time on two
# cores. A work unit is a whole test file (its module fixtures run once), or, where files share a session fixture of
# this tree (real_jobs, scenario_dumps, the multi-host ones), all of those files: a session fixture runs once per
# worker, so its files go to one worker and it runs once. Units start largest first, so that no long file starts last
# and keeps one core busy while the other idles.

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
TESTS = Path(__file__).resolve().parent


def shared_fixtures(item) -> set[str]:
    """The session-scoped fixtures defined in this tree (not in a plugin) that the item uses."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return set()
    return {name for name, defs in info.name2fixturedefs.items()
            if defs and defs[-1].scope == "session" and TESTS in Path(inspect.getfile(defs[-1].func)).parents}


def work_units(items) -> dict[str, str]:
    """{test file: its work unit}: the file itself, or the "+"-joined names of the shared session fixtures it uses
    (files sharing one of them, directly or through a third file, are one unit)."""
    uses: dict[str, set[str]] = {}
    for item in items:
        uses.setdefault(item.nodeid.split("::", 1)[0], set()).update(shared_fixtures(item))
    together = {name: {name} for used in uses.values() for name in used}
    for used in uses.values():
        merged = set().union(*(together[name] for name in used))
        for name in merged:
            together[name] = merged
    return {path: "+".join(sorted(together[min(used)])) if used else path for path, used in uses.items()}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which appends an xdist_group to the test's id
def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # not an xdist worker: nothing is distributed
        return
    units = work_units(items)
    unit = {item: units[item.nodeid.split("::", 1)[0]] for item in items}
    for item in items:
        if not item.nodeid.startswith(unit[item] + "::"):  # a unit of several files
            item.add_marker(pytest.mark.xdist_group(unit[item]))
    first = {u: i for i, u in enumerate(dict.fromkeys(unit.values()))}
    # the same order on every worker (xdist checks that the collections agree); it keeps each unit's own order
    items.sort(key=lambda item: (-UNIT_SECONDS.get(unit[item], 0), first[unit[item]]))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`, except that a test without an xdist_group mark goes with its file (as under
    `--dist loadfile`) rather than alone."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class FileOrGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.rfind("@") > nodeid.rfind("]"):  # an xdist_group (a parameter may hold an @ too)
                return super()._split_scope(nodeid)
            return nodeid.split("::", 1)[0]

    return FileOrGroupScheduling(config, log)
