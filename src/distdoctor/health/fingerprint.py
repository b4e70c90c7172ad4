"""Exact, cheap fingerprints of model (and optimizer) state, compared across data-parallel replicas.

Algorithm: each tensor's bytes are reinterpreted as integers of the element's width (float32 -> int32,
bfloat16 -> int16, float64 -> int64, ...) and summed into an int64 with wrap-around. Integer addition is
exact and associative, so the sum does not depend on summation order (thread count, vector width, device):
identical bytes give identical sums on any rank, and any single-element change — one ulp included — changes
the sum by a non-zero amount. (Float sums would lose a 1-ulp change in rounding, and differ between ranks
that sum in a different order.) Several changes can cancel only if their bit differences add up to zero.
Correct data-parallel replicas are bit-identical (DDP all-reduces gradients to the same bytes on every rank
and every rank applies the same update), so exact equality is the right test, not a tolerance.

Cost: an integer pass over the state is several times slower than a float one on CPU (~7 ns/element on one
core here), so each check fingerprints a budget of elements: the state is cut into chunks of at most 2^18
elements and each check takes the next chunks round-robin, up to `budget` elements (at least one chunk).
A divergence persists (DDP never re-syncs parameters), so it is found within one cycle of checks; models
under the budget are covered in full at every check.
"""

from __future__ import annotations

from collections import Counter

import torch

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor, start: int = 0, end: int | None = None) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t = t.to(torch.int8)
    flat = t.reshape(-1)[start:end]
    if flat.is_floating_point():
        flat = flat.contiguous().view(_INT_OF_WIDTH[flat.element_size()])
    return flat


CHUNK = 1 << 18


def chunk_fingerprint(t: torch.Tensor, start: int = 0, end: int | None = None) -> torch.Tensor:
    """int64 scalar: the wrapping sum of the bit patterns of t.flatten()[start:end]."""
    return _bits(t, start, end).sum(dtype=torch.int64)


def tensor_fingerprint(t: torch.Tensor) -> torch.Tensor:
    return chunk_fingerprint(t)


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                  buffers: bool = False) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every parameter (and buffer), then every optimizer state tensor, in a fixed order.

    Buffers are off by default: BatchNorm running statistics legitimately differ across ranks between DDP's
    broadcasts (each rank updates them from its own batch).
    """
    module = getattr(model, "module", model)  # DDP / DataParallel wrap the real model
    named = [(name, p) for name, p in module.named_parameters()]
    if buffers:
        named += [(f"buffer:{name}", b) for name, b in module.named_buffers() if b is not None]
    if optimizer is not None:
        names = {id(p): name for name, p in module.named_parameters()}
        for group in optimizer.param_groups:
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                for key in sorted(state):
                    value = state[key]
                    if torch.is_tensor(value):
                        named.append((f"optimizer:{names.get(id(p), '?')}.{key}", value))
    return named


class ChunkCursor:
    """Round-robin over chunks of the state: which (name, start, end) each check fingerprints."""

    def __init__(self, budget: int = CHUNK):
        self.budget = budget
        self._layout: list[tuple[str, int]] = []
        self._chunks: list[tuple[int, int, int]] = []  # (tensor index, start, end)
        self._pos = 0

    def next(self, named: list[tuple[str, torch.Tensor]]) -> list[tuple[int, int, int]]:
        layout = [(n, t.numel()) for n, t in named]
        if layout != self._layout:  # optimizer state appeared, or the model changed: start over
            self._layout = layout
            self._chunks = [(i, s, min(s + CHUNK, n)) for i, (_, n) in enumerate(layout) for s in range(0, max(n, 1), CHUNK)]
            self._pos = 0
        if not self._chunks:
            return []
        picked, total = [], 0
        while len(picked) < len(self._chunks) and (not picked or total + self._size(self._pos) <= self.budget):
            picked.append(self._chunks[self._pos])
            total += self._size(self._pos)
            self._pos = (self._pos + 1) % len(self._chunks)
        return sorted(picked)

    def _size(self, i: int) -> int:
        _, s, e = self._chunks[i]
        return e - s

    @property
    def cycle(self) -> int:
        """Elements in one full cycle (the whole state)."""
        return sum(n for _, n in self._layout)


def fingerprint(named: list[tuple[str, torch.Tensor]], chunks: list[tuple[int, int, int]]) -> torch.Tensor:
    """int64[len(chunks)] fingerprints on the CPU (what the collective sends)."""
    if not chunks:
        return torch.zeros(0, dtype=torch.int64)
    return torch.stack([chunk_fingerprint(named[i][1], s, e).cpu() for i, s, e in chunks])


def compare(gathered: list[torch.Tensor], names: list[str], ranks: list[int]) -> dict | None:
    """Find the first tensor whose fingerprint differs across ranks.

    gathered[i] is rank ranks[i]'s int64[P] (one fingerprint per checked chunk, names[j] naming chunk j).
    Returns None when all agree, else {"index", "name", "ranks" (the minority, or all ranks when there is no
    majority), "majority", "reference_rank", "groups", "count"}.
    """
    if len(gathered) < 2:
        return None
    stacked = torch.stack([g.cpu().reshape(len(names), -1) for g in gathered])  # [R, P, k]
    differs = (stacked != stacked[0:1]).any(dim=2).any(dim=0)  # [P]
    idx = torch.nonzero(differs).flatten()
    if idx.numel() == 0:
        return None
    first = int(idx[0])
    values = [tuple(stacked[r, first].tolist()) for r in range(len(ranks))]
    counts = Counter(values)
    (top, top_n), *rest = counts.most_common()
    has_majority = not rest or rest[0][1] < top_n
    odd = [ranks[r] for r, v in enumerate(values) if v != top] if has_majority else list(ranks)
    groups: dict[tuple, list[int]] = {}
    for r, v in enumerate(values):
        groups.setdefault(v, []).append(ranks[r])
    reference = next(ranks[r] for r, v in enumerate(values) if v == top) if has_majority else ranks[0]
    return {
        "index": first,
        "name": names[first] if first < len(names) else f"#{first}",
        "ranks": odd,
        "majority": has_majority,
        "reference_rank": reference,
        "groups": sorted(groups.values()),
        "count": int(idx.numel()),
    }
