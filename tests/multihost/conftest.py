"""Fixtures for real multi-host tests: virtual hosts (network namespaces on a bridge) and torchrun across them.

Every test gets fresh namespaces with pid-unique names; the finalizer kills every process in them and deletes
them, also when the test fails. Without root/iproute2 the tests that need hosts skip with the reason.
"""

from __future__ import annotations

import pytest

from distdoctor.testing import netns


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
