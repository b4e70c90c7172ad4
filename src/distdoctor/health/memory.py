"""Per-rank peak memory and its imbalance across ranks.

GPU: the CUDA caching allocator's peak (`torch.cuda.max_memory_allocated`) and reserved bytes. CPU: the
process's peak resident set size (`ru_maxrss`, the kernel's high-water mark) and current RSS from
/proc/self/statm. A rank is flagged when its peak exceeds the median of the *other* ranks' peaks by
`threshold` times and by at least `min_gap_bytes` (with two ranks a plain median would sit half-way
between them); the reported ratio is max / median over all ranks. The gap matters (CPU RSS of identical replicas differs by a few MiB: allocator noise, the
rank that hosts the rendezvous store).
"""

from __future__ import annotations

import os
import resource
import statistics

import torch


def peak_bytes(device: torch.device) -> float:
    if device.type == "cuda" and torch.cuda.is_available():
        return float(torch.cuda.max_memory_allocated(device))
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0  # Linux reports KiB


def current_bytes(device: torch.device) -> float:
    if device.type == "cuda" and torch.cuda.is_available():
        return float(torch.cuda.memory_allocated(device))
    try:
        with open("/proc/self/statm") as fh:
            return float(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_bytes(device)


def imbalance(peaks: dict[int, float], threshold: float = 1.25, min_gap_bytes: float = 256 * 2**20) -> dict:
    """max/median of per-rank peaks; the ranks above threshold x the others' median (and min_gap above it)."""
    if not peaks:
        return {"ratio": 1.0, "flagged": [], "median_bytes": 0.0}
    med = statistics.median(peaks.values())
    ratio = max(peaks.values()) / med if med > 0 else 1.0
    flagged = []
    for r, v in peaks.items():
        others = [p for q, p in peaks.items() if q != r]
        ref = statistics.median(others) if others else v
        if v > threshold * ref and v - ref >= min_gap_bytes:
            flagged.append(r)
    return {"ratio": ratio, "flagged": sorted(flagged), "median_bytes": med}
