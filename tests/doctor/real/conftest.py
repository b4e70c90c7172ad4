import os

import pytest

from .suite import LINT_SCENARIOS, SCENARIOS, run_suite

# Scenarios run at once: 4 keeps the whole suite near 45 s on 2 idle cores (each scenario is mostly waiting for
# its hang to be detected); more only adds contention.
PARALLEL = int(os.environ.get("REALJOBS_PARALLEL", "4"))


@pytest.fixture(scope="session")
def real_jobs(tmp_path_factory) -> dict:
    """Every real-library scenario run once under `distdoctor run` (see suite.py): {scenario: result}, where a
    result holds run_rc, job (jobs.py's status), leftover, seconds, stderr, modes {mode: dir} and mix."""
    return run_suite(str(tmp_path_factory.mktemp("realjobs")), [*SCENARIOS, *LINT_SCENARIOS], parallel=PARALLEL,
                     env=dict(os.environ))
