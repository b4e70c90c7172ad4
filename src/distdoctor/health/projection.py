"""Alpha-beta model of the gradient all-reduce, fitted from measurements, and projected scaling efficiency.

All-reduce time for n ranks and S bytes (ring, the algorithm nccl-tests' bus factor describes):
    t(n, S) = 2(n-1) * alpha + S * bus_factor(n) / B
alpha is the per-step latency, B the bus bandwidth (what nccl-tests calls busbw). Both are fitted from an
all_reduce sweep on n_m ranks by least squares on t = a + b*S: B = bus_factor(n_m) / b, alpha = a / 2(n_m-1).

Projection (data parallel, one all-reduce of the whole gradient per step):
  - compute time: weak scaling keeps the per-rank batch, so the measured compute time at the largest measured
    size is kept; strong scaling shrinks the per-rank batch, so compute(b) = c0 + c1*b is fitted from the
    measured strong-scaling points (c0 = 0 when there is only one point);
  - overlap: at the largest measured size the all-reduce takes t(n_m, S) by the model and the measured exposed
    (not hidden) part is e_m; the rest, h = t(n_m, S) - e_m, was hidden behind backward. Backward lasts as long
    as compute does, so the hideable time scales with compute: h(n) = h * compute(n) / compute(n_m);
  - exposed(n) = max(0, t(n, S) - h(n)); step(n) = compute(n) + exposed(n);
  - efficiency(n) = throughput(n) / (n * measured single-rank throughput).
Assumptions, stated in the output: one ring all-reduce at the fitted bandwidth at every size (no topology
change between nodes, no hierarchical algorithms), compute independent of world size, no stragglers.
"""

from __future__ import annotations

from distdoctor.collectives import bus_factor


def fit_alpha_beta(rows: list[dict], n: int) -> dict:
    """Least-squares fit of all_reduce rows ({"size_bytes", "time_us"}) measured on n ranks."""
    pts = [(float(r["size_bytes"]), float(r["time_us"])) for r in rows if r.get("op", "all_reduce") == "all_reduce"]
    if len(pts) < 2 or n < 2:
        raise ValueError("need all_reduce timings at two or more sizes on two or more ranks")
    k = len(pts)
    mx, my = sum(x for x, _ in pts) / k, sum(y for _, y in pts) / k
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    a = my - b * mx
    if b <= 0:  # time does not grow with size: the sweep was too small or too noisy to see bandwidth
        b = max(y for _, y in pts) / max(x for x, _ in pts)
    a = max(a, 0.0)
    ss_tot = sum((y - my) ** 2 for _, y in pts)
    ss_res = sum((y - a - b * x) ** 2 for x, y in pts)
    busbw_gbps = bus_factor("all_reduce", n) / b / 1e3  # bytes per microsecond -> GB/s
    return {"alpha_us": a / (2 * (n - 1)), "busbw_gbps": busbw_gbps, "fit_world_size": n, "points": k,
            "r2": 1 - ss_res / ss_tot if ss_tot > 0 else 1.0}


def allreduce_us(fit: dict, n: int, size_bytes: float) -> float:
    if n < 2:
        return 0.0
    return 2 * (n - 1) * fit["alpha_us"] + size_bytes * bus_factor("all_reduce", n) / (fit["busbw_gbps"] * 1e3)


def project(measured: list[dict], fit: dict, grad_bytes: float, sizes: list[int]) -> list[dict]:
    """Projected points ({"projected": True}) for each mode in `measured` and each world size in `sizes`."""
    out = []
    for mode in ("weak", "strong"):
        pts = sorted((m for m in measured if m["mode"] == mode), key=lambda m: m["world_size"])
        if not pts:
            continue
        base = pts[0]
        if base["world_size"] != 1:
            continue
        last = pts[-1]
        n_m = last["world_size"]
        c_m = last["compute_ms"] * 1e3
        hidden = max(0.0, allreduce_us(fit, n_m, grad_bytes) - last["exposed_allreduce_ms"] * 1e3) if n_m > 1 else 0.0
        if mode == "strong" and len(pts) >= 2:
            bs = [p["per_rank_batch"] for p in pts]
            cs = [p["compute_ms"] * 1e3 for p in pts]
            mb, mc = sum(bs) / len(bs), sum(cs) / len(cs)
            sbb = sum((b - mb) ** 2 for b in bs)
            c1 = sum((b - mb) * (c - mc) for b, c in zip(bs, cs)) / sbb if sbb else mc / mb
            c0 = mc - c1 * mb
            if c1 <= 0:  # noise: fall back to compute proportional to the batch
                c0, c1 = 0.0, mc / mb
        for n in sizes:
            if mode == "weak":
                batch, compute = base["per_rank_batch"], c_m
            else:
                if base["global_batch"] < n:
                    break  # fewer samples than ranks: strong scaling ends here
                batch = base["global_batch"] / n
                compute = (c0 + c1 * batch) if len(pts) >= 2 else base["compute_ms"] * 1e3 * batch / base["per_rank_batch"]
                compute = max(compute, 1e-3)
            t_ar = allreduce_us(fit, n, grad_bytes)
            exposed = max(0.0, t_ar - hidden * compute / c_m) if c_m > 0 else t_ar
            step_us = compute + exposed
            samples = batch * n / (step_us * 1e-6)
            out.append({"world_size": n, "mode": mode, "per_rank_batch": batch, "global_batch": batch * n,
                        "samples_per_s": samples, "step_ms": step_us / 1e3, "compute_ms": compute / 1e3,
                        "allreduce_ms": t_ar / 1e3, "exposed_allreduce_ms": exposed / 1e3,
                        "exposed_allreduce_share": exposed / step_us,
                        "efficiency": samples / (n * base["samples_per_s"]), "projected": True})
    return out
