"""HealthMonitor: replica consistency, NaN origin, loss trend, stragglers and memory in any training loop.

    monitor = HealthMonitor(model, optimizer, every=50, events_path="health.jsonl")
    for batch in loader:
        loss = loss_fn(model(batch.x), batch.y)
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        monitor.step(loss)
    print(monitor.report())

Per step (local, no collective): the loss is read (one host sync), the step time is taken, the NaN-origin
hooks' results are read. Every `every` steps (a collective on the data-parallel group, so every rank must
call step() the same number of times): one all_gather of a small float64 tensor per rank holding the
recent step/wait times and losses, the first non-finite record, peak memory and the exact fingerprints of
parameters and optimizer state (their int64 bits, viewed as float64 for the trip). Every rank then holds
the same gathered data and derives the same events; only the reporting rank (group rank 0) writes them to
the JSON-lines file and the log. Works without torch.distributed (a world of one: no gather).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distdoctor.health import fingerprint as fp
from distdoctor.health import memory
from distdoctor.health.events import EventSink, HealthEvent
from distdoctor.health.nan_origin import NanOrigin, NonFinite, Sentinel
from distdoctor.health.stragglers import StepTimer, straggler_scores
from distdoctor.health.trend import loss_trend

log = logging.getLogger("distdoctor.health")

_PHASES = ("forward", "backward", "loss", "update")
_HEADER = 11  # step, n times, n losses, nonfinite step, phase, module idx, param idx, prev-leaf idx, peak, current, comm measured


@dataclass
class RankView:
    """What the last gather said about one rank."""

    rank: int
    step: int
    step_s: list[float]
    wait_s: list[float]
    losses: list[float]
    peak_bytes: float
    current_bytes: float
    comm_measured: bool
    nonfinite: NonFinite | None


class HealthMonitor:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, every: int = 50,
                 group=None, events_path=None, *, check_nan: bool = True, nan_hooks: str = "replay", param_grads: bool = False, check_buffers: bool = False,
                 loss_window: int = 100, flat_rtol: float = 1e-4, rise_rtol: float = 0.05,
                 straggler_window: int = 200, straggler_threshold: float = 1.5, straggler_min_gap_s: float = 0.005,
                 timing_every: int = 4, fingerprint_budget: int = 1 << 18,
                 memory_threshold: float = 1.25, memory_min_gap_bytes: float = 256 * 2**20):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.model, self.optimizer, self.every, self.group = model, optimizer, every, group
        self.check_buffers = check_buffers
        self.distributed = dist.is_available() and dist.is_initialized()
        if self.distributed:
            self.ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
            self.rank = dist.get_rank()
            backend = dist.get_backend(group)
        else:
            self.ranks, self.rank, backend = [0], 0, "none"
        self.is_reporter = self.rank == self.ranks[0]
        first_param = next(model.parameters(), None)
        self.device = first_param.device if first_param is not None else torch.device("cpu")
        self.comm_device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.sink = EventSink(events_path, write=self.is_reporter)
        # default: a cheap sentinel that replays a bad step with full hooks (needs the optimizer's pre-step hook);
        # without an optimizer, or with nan_hooks="always", every module is hooked on every step
        if not check_nan:
            self.nan = None
        elif optimizer is not None and nan_hooks == "replay" and not param_grads:
            self.nan = Sentinel(model, optimizer)
        else:
            self.nan = NanOrigin(model, param_grads=param_grads)
        self.timer = StepTimer(sample_every=timing_every)
        self.cursor = fp.ChunkCursor(fingerprint_budget)
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not self.timer.attach_ddp(model):
            log.info("this torch has no DDP runtime stamps: collective wait is not measured (use monitor.comm())")
        inner = getattr(model, "module", model)
        self._module_names = [name or "<model>" for name, _ in inner.named_modules()] + ["<loss>"]
        self._param_names = [name for name, _ in inner.named_parameters()]
        self.loss_window, self.flat_rtol, self.rise_rtol = loss_window, flat_rtol, rise_rtol
        self.straggler_threshold, self.straggler_min_gap_s = straggler_threshold, straggler_min_gap_s
        self.memory_threshold, self.memory_min_gap_bytes = memory_threshold, memory_min_gap_bytes
        self.steps = 0  # completed steps; the step now running has index `steps`
        self._step_s: deque[float] = deque(maxlen=every)
        self._wait_s: deque[float] = deque(maxlen=every)
        self._losses: deque[float] = deque(maxlen=every)
        self._first_nonfinite: NonFinite | None = None
        self._world_losses: deque[float] = deque(maxlen=loss_window)
        self._compute: dict[int, deque[float]] = {r: deque(maxlen=straggler_window) for r in self.ranks}
        self.views: dict[int, RankView] = {}
        self.last_divergence: dict | None = None
        self.last_stragglers: dict | None = None
        self.last_memory: dict | None = None
        self.timer.start()
        from distdoctor.recorder import live  # the live watcher's metrics carry these signals (docs/live.md)

        live.publish("health", self.summary)

    # ---- the training-loop API -------------------------------------------------------------------------
    @property
    def events(self) -> list[HealthEvent]:
        return self.sink.events

    def comm(self):
        """`with monitor.comm(): dist.all_reduce(...)` — count that time as collective wait (non-DDP loops)."""
        return self.timer.comm()

    def step(self, loss=None) -> list[HealthEvent]:
        """Call once per training step, after optimizer.step(). Returns the events new at this step."""
        value = float(loss.detach().float()) if torch.is_tensor(loss) else (None if loss is None else float(loss))
        lap = self.timer.lap()
        if lap is not None:
            if math.isfinite(lap[2]) and self._wait_s:
                self._wait_s[-1] = min(lap[2], self._step_s[-1])
            self._step_s.append(lap[0])
            self._wait_s.append(lap[1])
        self._losses.append(math.nan if value is None else value)
        loss_finite = value is None or math.isfinite(value)
        if self.nan is not None:
            found = self.nan.collect(self.steps, loss_finite)
        else:
            found = None if loss_finite else NonFinite(self.steps, "loss", "<loss>")
        if found is not None and self._first_nonfinite is None:
            self._first_nonfinite = found
            log.warning("rank %d step %d: first non-finite value in %s of %s%s", self.rank, found.step, found.phase,
                        found.module, f" (local gradient of {found.parameter})" if found.parameter else "")
        self.steps += 1
        new: list[HealthEvent] = []
        if self.steps % self.every == 0:
            new = self.check()
        return new

    # ---- the collective check ----------------------------------------------------------------------------
    def _payload(self, named, chunks) -> torch.Tensor:
        nf = self._first_nonfinite
        module_idx = param_idx = prev_idx = -1.0
        if nf is not None:
            names = self._module_names
            module_idx = float(names.index(nf.module)) if nf.module in names else -1.0
            param_idx = float(self._param_names.index(nf.parameter)) if nf.parameter in self._param_names else -1.0
            prev_idx = float(names.index(nf.between[0])) if nf.between and nf.between[0] in names else -1.0
        header = [float(self.steps - 1), float(len(self._step_s)), float(len(self._losses)),
                  float(nf.step) if nf else -1.0, float(_PHASES.index(nf.phase)) if nf else -1.0, module_idx, param_idx, prev_idx,
                  memory.peak_bytes(self.device), memory.current_bytes(self.device), float(self.timer.comm_measured)]

        def padded(values):
            return list(values) + [math.nan] * (self.every - len(values))

        stats = torch.tensor(header + padded(self._step_s) + padded(self._wait_s) + padded(self._losses),
                             dtype=torch.float64)
        prints = fp.fingerprint(named, chunks).view(torch.float64)
        return torch.cat([stats, prints]).to(self.comm_device)

    def _unpack(self, rank: int, t: torch.Tensor) -> tuple[RankView, torch.Tensor]:
        t = t.cpu()
        h = t[:_HEADER].tolist()
        k, n_loss, e = int(h[1]), int(h[2]), self.every
        body = t[_HEADER:_HEADER + 3 * e].tolist()
        nf = None
        if h[3] >= 0:
            phase = _PHASES[int(h[4])]
            module = self._module_names[int(h[5])] if h[5] >= 0 else "?"
            param = self._param_names[int(h[6])] if h[6] >= 0 else ""
            between = [self._module_names[int(h[7])], module] if h[7] >= 0 else []
            nf = NonFinite(int(h[3]), phase, module, param, between)
        view = RankView(rank, int(h[0]), body[:k], body[e:e + k], body[2 * e:2 * e + n_loss],
                        h[8], h[9], bool(h[10]), nf)
        prints = t[_HEADER + 3 * e:].contiguous().view(torch.int64)
        return view, prints

    def check(self) -> list[HealthEvent]:
        """Gather every rank's state and run all cross-rank checks now. Collective: every rank must call it."""
        named = fp.state_tensors(self.model, self.optimizer, buffers=self.check_buffers)
        chunks = self.cursor.next(named)
        mine = self._payload(named, chunks)
        if self.distributed and len(self.ranks) > 1:
            parts = [torch.empty_like(mine) for _ in self.ranks]
            dist.all_gather(parts, mine, group=self.group)
        else:
            parts = [mine]
        before = len(self.sink.events)
        views, prints = {}, []
        for r, t in zip(self.ranks, parts):
            views[r], p = self._unpack(r, t)
            prints.append(p)
        self.views = views
        step = self.steps - 1
        self._check_nonfinite(views)
        self._check_replicas(prints, named, chunks, step)
        self._check_loss(views, step)
        self._check_stragglers(views, step)
        self._check_memory(views, step)
        self._step_s.clear(), self._wait_s.clear(), self._losses.clear()
        self.timer.start()  # the gather itself is not part of any step
        return self.sink.events[before:]

    def _check_nonfinite(self, views: dict[int, RankView]) -> None:
        seen = [(v.nonfinite.step, r, v.nonfinite) for r, v in views.items() if v.nonfinite is not None]
        if not seen:
            return
        first_step = min(s for s, _, _ in seen)
        at_first = [(r, n) for s, r, n in seen if s == first_step]
        direct = [r for r, n in at_first if n.phase != "update"]  # seen, not inferred from parameters
        culprits = sorted(direct or [r for r, _ in at_first])
        nf = views[culprits[0]].nonfinite
        if nf.phase == "forward":
            where = f"the output of {nf.module} (forward)"
        elif nf.phase == "loss":
            where = "the loss (the model's outputs were finite)"
        elif nf.phase == "update":
            where = (f"parameters of {nf.between[0]} and earlier were non-finite after the update: a non-finite "
                     f"gradient from the backward of {nf.module} or after it (under DDP the gradient is averaged, "
                     f"so the rank that made it is not known)")
        elif nf.parameter:
            where = f"the local gradient of {nf.parameter} (backward of {nf.module})"
        else:
            where = (f"the backward of {nf.module} (the gradient at the output of {nf.module} was finite, at the "
                     f"output of {nf.between[0]} it was not)") if nf.between else f"the backward of {nf.module}"
        self.sink.emit(HealthEvent(
            "nonfinite", first_step, culprits,
            f"first non-finite value at step {first_step} on rank(s) {culprits}: {where}",
            subject=nf.module, data={"phase": nf.phase, "module": nf.module, "parameter": nf.parameter, "between": nf.between,
                                     "per_rank": {str(r): {"step": n.step, "phase": n.phase, "module": n.module}
                                                  for _, r, n in seen}}))

    def _check_replicas(self, prints: list[torch.Tensor], named, chunks, step: int) -> None:
        diff = fp.compare(prints, [named[i][0] for i, _, _ in chunks], self.ranks)
        self.last_divergence = diff
        if diff is None:
            if self.cursor.cycle <= self.cursor.budget:  # the whole state was checked: replicas agree again
                self.sink.rearm("replica_divergence")
            return
        _, start, end = chunks[diff["index"]]
        diff["elements"] = [start, end]
        max_abs = self._measure_divergence(diff)
        diff["max_abs_diff"] = max_abs
        who = f"rank(s) {diff['ranks']} differ from the others" if diff["majority"] else \
            f"no majority among ranks {diff['ranks']} (groups {diff['groups']})"
        self.sink.emit(HealthEvent(
            "replica_divergence", step, diff["ranks"],
            f"replicas diverged by step {step}: first differing tensor {diff['name']} ({diff['count']} checked "
            f"chunk(s) differ); {who}; max |difference| {max_abs:.3g} from rank {diff['reference_rank']}",
            subject=diff["name"], data=dict(diff)))

    def _measure_divergence(self, diff: dict) -> float:
        """How far apart the first differing tensor is (a broadcast from a majority rank; all ranks take part)."""
        named = dict(fp.state_tensors(self.model, self.optimizer, buffers=self.check_buffers))
        mine = named[diff["name"]].detach()
        if not (self.distributed and len(self.ranks) > 1):
            return 0.0
        ref = mine.clone().to(self.comm_device)
        dist.broadcast(ref, src=diff["reference_rank"], group=self.group)
        local = (mine.double().to(self.comm_device) - ref.double()).abs().max() if mine.numel() else torch.zeros(
            (), dtype=torch.float64, device=self.comm_device)
        dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.group)
        return float(local)

    def _check_loss(self, views: dict[int, RankView], step: int) -> None:
        per_step = list(zip(*[v.losses for v in views.values()]))
        for values in per_step:
            finite = [x for x in values if math.isfinite(x)]
            self._world_losses.append(sum(values) / len(values) if len(finite) == len(values) else math.nan)
        if len(self._world_losses) < self.loss_window:
            return
        found = loss_trend(list(self._world_losses), self.flat_rtol, self.rise_rtol)
        for kind in ("loss_flat", "loss_rising"):
            if found is None or found["kind"] != kind:
                self.sink.rearm(kind)
        if found is not None:
            data = {k: v for k, v in found.items() if k not in ("kind", "detail")}
            self.sink.emit(HealthEvent(found["kind"], step, list(self.ranks), found["detail"], data=data))

    def _check_stragglers(self, views: dict[int, RankView], step: int) -> None:
        for r, v in views.items():
            # steps whose wait is known (sampled); without any wait measurement, the step time itself
            self._compute[r].extend(max(0.0, s - w) if math.isfinite(w) else s
                                    for s, w in zip(v.step_s, v.wait_s) if math.isfinite(w) or not v.comm_measured)
        found = straggler_scores({r: list(c) for r, c in self._compute.items()}, self.straggler_threshold,
                                 self.straggler_min_gap_s)
        self.last_stragglers = found
        if not found["flagged"]:
            self.sink.rearm("straggler")
        for r in found["flagged"]:
            med = found["median_s"]
            others = sorted(m for q, m in med.items() if q != r)
            self.sink.emit(HealthEvent(
                "straggler", step, [r],
                f"rank {r} computes {1e3 * med[r]:.2f} ms per step vs {1e3 * others[len(others) // 2]:.2f} ms on the "
                f"others (score {found['score'][r]:.2f}); the other ranks wait for it in the gradient all-reduce",
                data={"score": {str(q): s for q, s in found["score"].items()},
                      "median_compute_s": {str(q): m for q, m in med.items()},
                      "late_s": {str(q): t for q, t in found["late_s"].items()}}))

    def _check_memory(self, views: dict[int, RankView], step: int) -> None:
        peaks = {r: v.peak_bytes for r, v in views.items()}
        found = memory.imbalance(peaks, self.memory_threshold, self.memory_min_gap_bytes)
        self.last_memory = found
        if found["flagged"]:
            self.sink.emit(HealthEvent(
                "memory_imbalance", step, found["flagged"],
                f"peak memory on rank(s) {found['flagged']} is "
                f"{', '.join(f'{peaks[r] / 2**20:.0f}' for r in found['flagged'])} MiB vs median "
                f"{found['median_bytes'] / 2**20:.0f} MiB (max/median {found['ratio']:.2f})",
                data={"peak_bytes": {str(r): p for r, p in peaks.items()}, "ratio": found["ratio"]}))

    # ---- reporting -----------------------------------------------------------------------------------------
    def summary(self) -> dict:
        """The last gathered state and all events, JSON-ready (identical on every rank)."""
        s = self.last_stragglers or {"median_s": {}, "score": {}, "flagged": []}
        ranks = []
        for r, v in sorted(self.views.items()):
            # DDP publishes a step's collective wait one step late, so the newest step has none yet. Take the
            # medians of step, wait and compute (step - wait) over the same steps: each wait and each compute is
            # at most its step, and so are their medians (the straggler window's longer history is not mixed in).
            timed = [(st, w) for st, w in zip(v.step_s, v.wait_s) if math.isfinite(w)] if v.comm_measured else []
            comp = [max(0.0, st - w) for st, w in timed] if timed else list(v.step_s)
            ranks.append({
                "rank": r, "step": v.step,
                "step_ms": _median_ms([st for st, _ in timed] if timed else v.step_s),
                "wait_ms": _median_ms([w for _, w in timed]) if v.comm_measured else None,
                "compute_ms": _median_ms(comp), "straggler_score": s["score"].get(r),
                "peak_mib": v.peak_bytes / 2**20,
                "replica_ok": not (self.last_divergence and r in self.last_divergence["ranks"]),
                "first_nonfinite": None if v.nonfinite is None else {
                    "step": v.nonfinite.step, "phase": v.nonfinite.phase, "module": v.nonfinite.module,
                    "parameter": v.nonfinite.parameter},
            })
        return {"steps": self.steps, "ranks": ranks, "events": [e.to_json() for e in self.events]}

    def report(self) -> str:
        """A table per rank and the events, as text (rich)."""
        from distdoctor.report.health_text import render_summary

        return render_summary(self.summary())

    def close(self) -> None:
        if self.nan is not None:
            self.nan.remove()


def _median_ms(values) -> float | None:
    values = sorted(x for x in values if math.isfinite(x))
    return 1e3 * values[len(values) // 2] if values else None
