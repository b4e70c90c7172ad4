"""Loss trend over a window of steps: flat or rising, judged by a least-squares line through the window.

change = slope * (window - 1), relative to |mean loss|. Rising: the relative change exceeds `rise_rtol`
and the slope is significant (|t| > 3, so noise alone does not trigger it). Flat: the relative change is
below `flat_rtol` and the spread of the window is too (a frozen model on varying batches still moves).
Non-finite losses are reported by the NaN-origin check, which also says where they came from.
"""

from __future__ import annotations

import math


def loss_trend(losses: list[float], flat_rtol: float = 1e-4, rise_rtol: float = 0.05) -> dict | None:
    """None when the window is fine (or has non-finite values); else {"kind", "detail", numbers...}."""
    n = len(losses)
    if n < 4 or not all(math.isfinite(x) for x in losses):
        return None
    mean_x = (n - 1) / 2
    mean_y = sum(losses) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    slope = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(losses)) / sxx
    resid = sum((y - mean_y - slope * (i - mean_x)) ** 2 for i, y in enumerate(losses))
    stderr = math.sqrt(resid / (n - 2) / sxx) if n > 2 else 0.0
    scale = max(abs(mean_y), 1e-12)
    change = slope * (n - 1)
    spread = (max(losses) - min(losses)) / scale
    numbers = {"window": n, "first": losses[0], "last": losses[-1], "mean": mean_y, "slope_per_step": slope,
               "relative_change": change / scale}
    if change / scale > rise_rtol and (stderr == 0 or slope / stderr > 3):
        return {"kind": "loss_rising", **numbers,
                "detail": f"loss rose {100 * change / scale:+.1f}% over the last {n} steps "
                          f"(fitted {mean_y - change / 2:.6g} -> {mean_y + change / 2:.6g}, slope {slope:.3g}/step)"}
    if abs(change) / scale < flat_rtol and spread < 10 * flat_rtol:
        return {"kind": "loss_flat", **numbers,
                "detail": f"loss flat at {mean_y:.6g} over the last {n} steps "
                          f"(change {100 * change / scale:+.4f}%, range {100 * spread:.4f}%)"}
    return None
