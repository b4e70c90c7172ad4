"""Exact, cheap fingerprints of model (and optimizer) state, compared across data-parallel replicas.

Algorithm: each tensor is reinterpreted as integers of its own width (float32 -> int32, bfloat16 -> int16,
...), widened to int64, and reduced to two numbers: the plain sum and the position-weighted sum
sum_i (i+1) * bits_i, both with int64 wrap-around. Any change of a single element — one ulp included —
changes the plain sum by a non-zero amount; two elements swapped change the weighted sum. Float sums
would lose a 1-ulp change in rounding; integer sums cannot. Data-parallel replicas that are correct are
bit-identical (DDP all-reduces gradients to the same bytes on every rank and every rank applies the same
update), so exact equality is the right test, not a tolerance.

The fingerprints of all tensors form one small int64 tensor (2 per tensor) that is all-gathered over the
data-parallel group; the comparison happens on every rank from the gathered copy.
"""

from __future__ import annotations

from collections import Counter

import torch

_INT_OF_WIDTH = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        t = t.to(torch.int8)
    flat = t.contiguous().reshape(-1)
    if flat.is_floating_point():
        flat = flat.view(_INT_OF_WIDTH[flat.element_size()])
    return flat.to(torch.int64)


_weights: dict[tuple[int, torch.device], torch.Tensor] = {}


def tensor_fingerprint(t: torch.Tensor) -> torch.Tensor:
    """int64[2]: (sum of bit patterns, position-weighted sum), both wrapping."""
    bits = _bits(t)
    key = (bits.numel(), bits.device)
    w = _weights.get(key)
    if w is None:
        if len(_weights) > 256:  # many distinct sizes: don't grow without bound
            _weights.clear()
        w = _weights[key] = torch.arange(1, bits.numel() + 1, dtype=torch.int64, device=bits.device)
    return torch.stack([bits.sum(), (bits * w).sum()])


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


def fingerprint(named: list[tuple[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
    """int64[len(named), 2] fingerprints on `device` (what the collective sends)."""
    if not named:
        return torch.zeros((0, 2), dtype=torch.int64, device=device)
    return torch.stack([tensor_fingerprint(t).to(device) for _, t in named])


def compare(gathered: list[torch.Tensor], names: list[str], ranks: list[int]) -> dict | None:
    """Find the first tensor whose fingerprint differs across ranks.

    gathered[i] is rank ranks[i]'s int64[P, 2]. Returns None when all agree, else
    {"index", "name", "ranks" (the minority, or all ranks when there is no majority), "groups"}.
    """
    if len(gathered) < 2:
        return None
    stacked = torch.stack([g.cpu() for g in gathered])  # [R, P, 2]
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
