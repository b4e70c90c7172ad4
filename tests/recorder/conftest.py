"""Fixtures for the recorder tests (helpers live in recorder_helpers.py)."""

from __future__ import annotations

import pytest

from recorder_helpers import Ranks, poll_until


@pytest.fixture
def ranks_factory(tmp_path):
    started: list[Ranks] = []

    def start(script: str, nranks: int, env: dict | None = None, args=()) -> Ranks:
        r = Ranks(script, nranks, tmp_path / "dumps", env, args)
        started.append(r)
        return r

    yield start
    for r in started:
        r.kill()
        for log in r.logs:
            log.close()


@pytest.fixture
def wait_for():
    return poll_until
