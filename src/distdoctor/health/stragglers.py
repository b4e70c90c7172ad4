"""Per-rank step time, split into compute and time spent waiting in collectives, and straggler scores.

In synchronous data parallelism every rank's *step* time is the same: the fast ranks wait for the slow one
inside the gradient all-reduce. What differs is how the step splits: the slow rank computes longer and
waits less. So a straggler is found from compute time = step time - collective wait time.

Collective wait is measured by wrapping DDP's gradient all-reduce in a communication hook (torch's own
`allreduce_hook`, so the arithmetic is unchanged): for each bucket we note when it became ready (its
gradients were computed) and when its all-reduce finished. The wait not hidden behind backward is
last finish - last ready. Training loops without DDP time their collectives with `monitor.comm()`.

Score (as other straggler detectors define it): reference / own median compute time, where the reference
is the median of the other ranks' medians; 1.0 is typical, 0.5 means twice as slow as the others. A rank
is flagged when its median exceeds the reference by `threshold` times and by at least `min_gap_s`, and only once every rank has `min_samples` steps (a
single slow step — a page fault, a checkpoint — is not a straggler).
"""

from __future__ import annotations

import statistics
import threading
import time
from contextlib import contextmanager

import torch.distributed as dist


class StepTimer:
    def __init__(self):
        self._last = None
        self._lock = threading.Lock()
        self._ready: list[float] = []
        self._done: list[float] = []
        self._manual_wait = 0.0
        self.comm_measured = False

    def start(self) -> None:
        self._last = time.perf_counter()

    def lap(self) -> tuple[float, float] | None:
        """Close the current step: (step seconds, collective wait seconds), or None for the first call."""
        now = time.perf_counter()
        last, self._last = self._last, now
        with self._lock:
            wait = self._manual_wait
            if self._ready and self._done:
                wait += max(0.0, max(self._done) - max(self._ready))
            self._ready.clear()
            self._done.clear()
            self._manual_wait = 0.0
        if last is None:
            return None
        step = now - last
        return step, min(wait, step)

    @contextmanager
    def comm(self):
        """Count the time inside this block as collective wait (for loops that all-reduce by hand)."""
        self.comm_measured = True
        t0 = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self._manual_wait += time.perf_counter() - t0

    def install_ddp_hook(self, ddp) -> bool:
        """Register a timing all-reduce hook on a DDP model. False when the model already has a comm hook."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        timer = self

        def timed_allreduce(state, bucket):
            ready = time.perf_counter()
            with timer._lock:
                timer._ready.append(ready)
            fut = allreduce_hook(state, bucket)

            def finished(f):
                with timer._lock:
                    timer._done.append(time.perf_counter())
                return f.value()

            return fut.then(finished)

        try:
            ddp.register_comm_hook(ddp.process_group, timed_allreduce)
        except RuntimeError:
            return False
        self.comm_measured = True
        return True


def straggler_scores(compute: dict[int, list[float]], threshold: float = 1.5, min_gap_s: float = 0.005,
                     min_samples: int = 10) -> dict:
    """Per-rank median compute time and score; the ranks flagged as stragglers.

    compute: global rank -> recent compute times in seconds.
    """
    medians = {r: statistics.median(v) for r, v in compute.items() if v}
    scores, flagged = {}, []
    for r, own in medians.items():
        others = [m for q, m in medians.items() if q != r]
        if not others:
            scores[r] = 1.0
            continue
        ref = statistics.median(others)
        scores[r] = ref / own if own > 0 else float("inf")
        enough = all(len(v) >= min_samples for v in compute.values())
        if enough and own > threshold * ref and own - ref >= min_gap_s:
            flagged.append(r)
    return {"median_s": medians, "score": scores, "flagged": sorted(flagged)}
