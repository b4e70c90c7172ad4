"""The one straggler rule: which ranks arrive late at collectives, by how much, and whether that is more than noise.

Used by diagnose (arrival times from traces, diagnose/straggler.py), validate (the wait at the barrier before
each checked call) and the health monitor (each step's compute time, i.e. the arrival at the gradient
all-reduce). Pure arithmetic on numbers; nothing here knows where they came from.

Lateness. In one collective every member has an arrival time on a clock shared within that collective. A rank's
lateness there is its arrival minus the median arrival of the OTHER members: a late rank is late against the
group's typical member, and ranks that are on time sit near 0 whatever one slow rank does.

Decision, over a set of comparable collectives (diagnose: one class, the same group, op and sizes; validate and
health: all of a rank's), rank r is late when its median lateness m is
  - at least `min_late_s` (each caller's floor: diagnose MIN_LATE_S, validate --straggler-threshold, the health
    monitor straggler_min_gap_s), and
  - at least `min_step_share` of the step, when the step is known, and
  - at least Z robust standard errors above zero, the noise being 1.4826 x the median absolute deviation of
    every member's lateness from its own median (a slow rank's own scatter counts too).
Medians and MADs ignore a few hiccups (a GC pause, a descheduled process) that would move a mean.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

MIN_LATE_S = 0.02
MIN_STEP_SHARE = 0.05
Z = 4.0
NOISE_FLOOR_S = 1e-4  # a perfectly steady set of samples is not infinitely significant


def median_of_others(a: np.ndarray) -> np.ndarray:
    """For each cell, the median of the other cells of its row (rows are collectives, columns ranks)."""
    n = a.shape[1]
    order = np.argsort(a, axis=1, kind="stable")
    s = np.take_along_axis(a, order, axis=1)
    pos = np.empty_like(order)
    np.put_along_axis(pos, order, np.arange(n)[None, :].repeat(a.shape[0], axis=0), axis=1)
    m = n - 1  # the others

    def others_at(j):  # the j-th smallest of the others, for every cell
        jj = np.where(j < pos, j, j + 1)
        return np.take_along_axis(s, jj, axis=1)

    if m % 2:
        return others_at(np.full_like(pos, m // 2))
    return (others_at(np.full_like(pos, m // 2 - 1)) + others_at(np.full_like(pos, m // 2))) / 2


def judge_lateness(late: np.ndarray, min_late_s: float = MIN_LATE_S, step_s: float | None = None,
                   min_step_share: float = MIN_STEP_SHARE, z: float = Z):
    """The decision on a matrix of lateness (collectives x ranks; NaN where a rank was not a member).

    Returns (median lateness per rank, the noise, whether each rank is late)."""
    ragged = bool(np.isnan(late).any())
    median = np.nanmedian if ragged else np.median
    med = median(late, axis=0)
    noise = max(1.4826 * float(median(np.abs(late - med))), NOISE_FLOOR_S)
    samples = (~np.isnan(late)).sum(axis=0) if ragged else len(late)
    se = 1.2533 * noise / np.sqrt(samples)
    is_late = (med >= min_late_s) & (med >= z * se)
    if step_s:
        is_late &= med >= min_step_share * step_s
    return med, noise, is_late


@dataclass
class Lateness:
    """What the rule says about a set of collectives."""

    median_s: dict[int, float]  # every rank's median lateness
    late: dict[int, float]  # the ranks judged late -> their median lateness
    samples_s: dict[int, list[float]]  # every rank's lateness at each collective it was in
    noise_s: float


def late_ranks(arrivals: Iterable[Mapping[int, float]], min_late_s: float = MIN_LATE_S,
               step_s: float | None = None) -> Lateness:
    """Arrival times in (one mapping rank -> arrival per collective, any clock shared within a collective),
    late ranks with their lateness out. Collectives with fewer than two members say nothing and are skipped."""
    samples: dict[int, list[float]] = {}
    for row in arrivals:
        if len(row) < 2:
            continue
        for rank, t in row.items():
            others = [u for q, u in row.items() if q != rank]
            samples.setdefault(rank, []).append(t - statistics.median(others))
    ranks = sorted(samples)
    if not ranks:
        return Lateness({}, {}, {}, NOISE_FLOOR_S)
    late = np.full((max(len(v) for v in samples.values()), len(ranks)), np.nan)
    for j, r in enumerate(ranks):
        late[: len(samples[r]), j] = samples[r]
    med, noise, is_late = judge_lateness(late, min_late_s, step_s)
    return Lateness({r: float(med[j]) for j, r in enumerate(ranks)},
                    {r: float(med[j]) for j, r in enumerate(ranks) if is_late[j]},
                    samples, noise)
