"""The one straggler rule (world/lateness.py) that diagnose, validate and the health monitor share: arrival times
in, late ranks with their lateness out, the same answer whichever way the arrivals arrive."""

import numpy as np
import pytest

from distdoctor.health.stragglers import straggler_scores
from distdoctor.validate.sweep import _stragglers
from distdoctor.world.lateness import judge_lateness, late_ranks, median_of_others


def _arrivals(seed: int, late_rank: int = 2, late_s: float = 0.05, ranks: int = 4, calls: int = 12):
    rng = np.random.default_rng(seed)
    a = rng.normal(0.0, 0.002, (calls, ranks)) + np.arange(calls)[:, None]  # a new clock origin per call is fine
    a[:, late_rank] += late_s
    return a


def test_arrivals_in_late_ranks_with_lateness_out():
    found = late_ranks([dict(enumerate(row)) for row in _arrivals(0)], min_late_s=0.02)
    assert list(found.late) == [2] and found.late[2] == pytest.approx(0.05, abs=0.005)
    assert all(abs(found.median_s[r]) < 0.005 for r in (0, 1, 3))  # on time: near 0 whatever rank 2 does
    assert found.samples_s[2] and len(found.samples_s[2]) == 12


def test_the_floor_and_the_noise_both_decide():
    rows = [dict(enumerate(row)) for row in _arrivals(1)]
    assert late_ranks(rows, min_late_s=0.1).late == {}  # below the caller's floor
    rng = np.random.default_rng(2)
    noisy = _arrivals(2) + rng.normal(0.0, 0.2, (12, 4))  # 50 ms late inside 200 ms of noise: not significant
    assert late_ranks([dict(enumerate(row)) for row in noisy], min_late_s=0.02).late == {}


def test_ragged_rows_and_the_matrix_give_the_same_answer():
    """validate's subgroups and the health monitor's missing samples make ragged rows; diagnose's classes are a
    full matrix: one rule for both."""
    a = _arrivals(3)
    med, noise, is_late = judge_lateness(a - median_of_others(a), min_late_s=0.02)
    found = late_ranks([dict(enumerate(row)) for row in a], min_late_s=0.02)
    assert [found.median_s[r] for r in range(4)] == pytest.approx(list(med))
    assert sorted(found.late) == [r for r in range(4) if is_late[r]] == [2]
    assert found.noise_s == pytest.approx(noise)
    pairs = [{0: row[0], 2: row[2]} for row in a] + [{1: row[1], 3: row[3]} for row in a]  # two 2-rank groups
    assert list(late_ranks(pairs, min_late_s=0.02).late) == [2]


def test_validate_and_the_health_monitor_name_the_same_straggler():
    a = _arrivals(4)
    # validate: -wait at the barrier is the arrival (everyone leaves together)
    done = {i: {r: {"rank": r, "members": [0, 1, 2, 3], "wait": float(row.max() - row[r])} for r in range(4)}
            for i, row in enumerate(a)}
    stragglers, per_rank = _stragglers(None, done, 4, threshold=0.02)
    assert [s["rank"] for s in stragglers] == [2] and stragglers[0]["median_late_s"] == pytest.approx(0.05, abs=0.005)
    assert per_rank["2"] == pytest.approx(stragglers[0]["median_late_s"], abs=1e-4)
    # the health monitor: each step's compute time is the arrival at the gradient all-reduce
    compute = {r: list(0.01 + a[:, r] - np.arange(12)) for r in range(4)}
    assert straggler_scores(compute, threshold=1.5, min_gap_s=0.005)["flagged"] == [2]
