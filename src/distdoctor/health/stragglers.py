"""Per-rank step time, split into compute and time spent waiting in collectives, and straggler scores.

In synchronous data parallelism every rank's *step* time is the same: the fast ranks wait for the slow one
inside the gradient all-reduce. What differs is how the step splits: the slow rank computes longer and
waits less. So a straggler is found from compute time = step time - collective wait time.

Collective wait under DDP comes from DDP's own runtime timers (the reducer stamps when the local backward
finished and when the last gradient all-reduce finished; `_get_ddp_logging_data()`): wait = comm end -
backward end, the part of the all-reduce not hidden behind backward. The reducer stamps every iteration
(C++, nearly free); reading the stamps costs ~0.1 ms, so they are read every `sample_every` steps and the
other steps carry only their total time. (A Python communication hook would see the same thing but makes
DDP copy the gradients more, several % of a step.) Loops without DDP time their collectives with
`monitor.comm()`, which counts on every step.

Decision: the one straggler rule (world/lateness.py) on each step's compute times, which are the ranks' arrivals
at the gradient all-reduce (every rank starts a step when the previous all-reduce ends): a rank is late when
its median compute time exceeds the median of the others' by at least `min_gap_s` and by `threshold` times the
typical rank's (compute more than `threshold` x the others'), and by more than the step-to-step noise can
explain; and only once every rank has `min_samples` samples (a single slow step — a page fault, a checkpoint —
is not a straggler). Score (as other straggler detectors define it, reported with each rank): reference / own
median compute time, where the reference is the median of the other ranks' medians; 1.0 is typical, 0.5 means
twice as slow as the others.
"""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager

from distdoctor.world.lateness import late_ranks


class StepTimer:
    def __init__(self, sample_every: int = 4):
        self.sample_every = sample_every
        self._last: float | None = None
        self._last_ns = 0
        self._prev_ns = 0
        self._laps = 0
        self._manual_wait = 0.0
        self._manual_used = False
        self._ddp = None
        self.comm_measured = False

    def start(self) -> None:
        self._last = time.perf_counter()
        self._last_ns = time.time_ns()
        self._prev_ns = 0

    def attach_ddp(self, ddp) -> bool:
        """Turn on DDP's per-iteration runtime stamps. False when this torch lacks them."""
        try:
            ddp._set_ddp_runtime_logging_sample_rate(1)
        except (AttributeError, RuntimeError):
            return False
        self._ddp = ddp
        self.comm_measured = True
        return True

    def _ddp_wait(self, prev_start_ns: int, start_ns: int) -> float:
        """Seconds the PREVIOUS step waited for its gradient all-reduce after its backward; nan if unknown.

        DDP publishes an iteration's stamps when the next forward starts, so after step s they describe s-1."""
        try:
            data = self._ddp._get_ddp_logging_data()
        except RuntimeError:
            return math.nan
        end, comm_end = data.get("backward_compute_time_end", 0), data.get("backward_comm_time_end", 0)
        if not end or not comm_end or not prev_start_ns or not prev_start_ns <= end <= start_ns:
            return math.nan
        return max(0.0, (comm_end - end) / 1e9)

    def lap(self) -> tuple[float, float, float] | None:
        """Close the current step: (step seconds, its collective wait or nan, the previous step's wait or nan).

        None for the first call. Under DDP the wait arrives one step late (see _ddp_wait)."""
        now, now_ns = time.perf_counter(), time.time_ns()
        last, last_ns, prev_ns = self._last, self._last_ns, self._prev_ns
        self._last, self._last_ns, self._prev_ns = now, now_ns, last_ns
        wait = prev_wait = math.nan
        if self._manual_used:
            wait = self._manual_wait
        elif self._ddp is not None and self._laps % self.sample_every == 0:
            prev_wait = self._ddp_wait(prev_ns, last_ns)
        self._manual_wait = 0.0
        self._laps += 1
        if last is None:
            return None
        step = now - last
        return step, (min(wait, step) if math.isfinite(wait) else math.nan), prev_wait

    @contextmanager
    def comm(self):
        """Count the time inside this block as collective wait (for loops that all-reduce by hand)."""
        self.comm_measured = self._manual_used = True
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._manual_wait += time.perf_counter() - t0


def straggler_scores(compute: dict[int, list[float]], threshold: float = 1.5, min_gap_s: float = 0.005,
                     min_samples: int = 5) -> dict:
    """Per-rank median compute time, score and lateness; the ranks flagged as stragglers.

    compute: global rank -> recent compute times in seconds, one per step (the most recent steps are aligned).
    """
    medians = {r: statistics.median(v) for r, v in compute.items() if v}
    scores = {}
    for r, own in medians.items():
        others = [m for q, m in medians.items() if q != r]
        scores[r] = (statistics.median(others) / own if own > 0 else float("inf")) if others else 1.0
    steps = min((len(v) for v in compute.values()), default=0)
    rows = [{r: v[len(v) - steps + i] for r, v in compute.items()} for i in range(steps)]
    typical = statistics.median(medians.values()) if medians else 0.0
    found = late_ranks(rows, min_late_s=max(min_gap_s, (threshold - 1) * typical))
    enough = bool(compute) and all(len(v) >= min_samples for v in compute.values())
    flagged = sorted(found.late) if enough else []
    return {"median_s": medians, "score": scores, "flagged": flagged, "late_s": found.median_s}
