"""Fixtures for real multi-host tests: virtual hosts (network namespaces on a bridge) and torchrun across them.

Every test gets fresh namespaces with pid-unique names; the finalizer kills every process in them and deletes
them, also when the test fails. Without root/iproute2 the tests that need hosts skip with the reason.

The fault scenarios (a link cut, a node lost, a recorded job losing a node, a standalone world) spend most of
their time waiting once the fault is in: for a collective to time out, for a lost peer to be noticed, for the
cut-off host to give up. So they overlap, each in its own cluster: when the first test asks for one, the first
scenario starts; each next one starts as soon as the previous one says it is only waiting (its fault injected),
so no two start up (CPU-bound: every process imports torch) at once and no timing bound is squeezed. Each test
then asserts on its own scenario's outcome. Only the scenarios of selected tests run.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from distdoctor.testing import netns

from mh_helpers import SCENARIOS


def pytest_configure(config):
    config.addinivalue_line("markers", "scenario(name): asserts on a multi-host scenario run side by side "
                                       "with the others (see tests/multihost/conftest.py)")


@pytest.fixture(scope="session")
def netns_ok():
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build virtual hosts: {reason}")
    netns.cleanup_stale()
    return True


@pytest.fixture
def cluster(netns_ok, request):
    c = netns.VirtualCluster(2)
    request.addfinalizer(c.close)
    return c.start()


# A scenario that never reports idle (stuck in its startup) holds the next one back no longer than this.
NEXT_START_AT_LATEST_S = 180


class Scenarios:
    """Runs the registered scenarios in threads, each with a fresh 2-host cluster that is closed (every process
    killed, every namespace deleted) when the scenario ends, whatever happened. A scenario is called as
    fn(cluster, tmp_path, idle) and calls idle() once it only waits."""

    def __init__(self, names: list[str], tmp_path_factory) -> None:
        self.names = [n for n in SCENARIOS if n in names]  # registration order: the longest first
        self.tmp_path_factory = tmp_path_factory
        self.futures: dict[str, Future] = {}
        self.pool = ThreadPoolExecutor(max(1, len(self.names)), thread_name_prefix="mh-scenario")

    def result(self, name: str):
        """The scenario's outcome; re-raises what failed inside it (pytest.fail included)."""
        if not self.futures:
            previous = None
            for n in self.names:
                idle = threading.Event()
                self.futures[n] = self.pool.submit(self._run, n, previous, idle)
                previous = idle
        return self.futures[name].result()

    def _run(self, name: str, after: threading.Event | None, idle: threading.Event):
        if after is not None:
            after.wait(NEXT_START_AT_LATEST_S)
        cluster = netns.VirtualCluster(2)
        try:
            cluster.start()
            return SCENARIOS[name](cluster, self.tmp_path_factory.mktemp(name), idle.set)
        finally:
            idle.set()
            cluster.close()

    def close(self) -> None:
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="session")
def scenarios(netns_ok, request, tmp_path_factory):
    names = [m.args[0] for item in request.session.items for m in item.iter_markers("scenario")]
    runner = Scenarios(names, tmp_path_factory)
    yield runner
    runner.close()
