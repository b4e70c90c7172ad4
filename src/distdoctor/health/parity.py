"""`distdoctor parity`: data parallelism must give the parameters one process would get.

The check: K training steps of a small float64 MLP (SGD with momentum, mean-squared error) on a global
batch of B samples per step, run
  - `ddp`            DDP across N ranks, each on its B/N shard;
  - `ddp_grad_accum` the same, each rank's shard split into A micro-batches, gradients accumulated over A
                     backward passes with DDP all-reducing on every pass;
  - `ddp_no_sync`    the same, with the first A-1 backward passes under `no_sync()` (one all-reduce per step);
  - `data_parallel`  `nn.DataParallel` over all local GPUs in this process (skipped, with the reason, when
                     there are fewer than two GPUs);
is compared with one process training on the whole batch B: per parameter tensor, the max |difference|
and the max relative difference, on the worst rank. In float64 the only differences are the rounding of a
different summation order, so the tolerance can be tight (default rtol 1e-10 on top of atol 1e-12; the measured differences are about 1e-17); a real
bug (a missed all-reduce, a wrong average, a stale gradient) is many orders of magnitude larger. DDP
replicas must also be bit-identical to each other (`ranks_identical`).

Inputs come from (seed, step), never from a reference run. `--inject drift:RANK[:PARAM]` (the one fault grammar,
world/faults.py) moves one element of PARAM (default: the first weight) by 1e-6 on RANK after the first step, to
show that the check fails (exit 1) and names the rank; `drift:RANK:AMOUNT`, the older spelling, moves the first
weight by AMOUNT.
"""

from __future__ import annotations

import json
from contextlib import nullcontext

import click
import torch
import torch.nn as nn

from distdoctor.errors import CheckFailed, InputError
from distdoctor.options import SEED, Number, count
from distdoctor.world import config_from_options, resolve_nproc, run_job, world_options
from distdoctor.world.faults import PARITY_KINDS, parse_fault

MODES = ("ddp", "ddp_grad_accum", "ddp_no_sync", "data_parallel")
D_IN, HIDDEN, D_OUT = 8, 16, 4
DRIFT = 1e-6  # what --inject drift moves one element by: far beyond rounding (~1e-17) and the tolerance


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh(),
                         nn.Linear(HIDDEN, D_OUT)).double()


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def global_batch(seed: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, D_IN, generator=g, dtype=torch.float64)
    y = torch.sin(x @ torch.randn(D_IN, D_OUT, generator=g, dtype=torch.float64))
    return x, y


def reference(steps: int, batch: int, seed: int, lr: float, device="cpu") -> dict[str, list[float]]:
    """One process, the whole batch per step: what every data-parallel run must reproduce."""
    model = make_model(seed).to(device)
    opt = make_optimizer(model, lr)
    for step in range(steps):
        x, y = global_batch(seed, step, batch)
        opt.zero_grad()
        nn.functional.mse_loss(model(x.to(device)), y.to(device)).backward()
        opt.step()
    return {n: p.detach().cpu().reshape(-1).tolist() for n, p in model.named_parameters()}


def data_parallel(steps: int, batch: int, seed: int, lr: float) -> dict[str, list[float]]:
    model = make_model(seed).cuda()
    dp = nn.DataParallel(model)
    opt = make_optimizer(model, lr)
    for step in range(steps):
        x, y = global_batch(seed, step, batch)
        opt.zero_grad()
        nn.functional.mse_loss(dp(x.cuda()), y.cuda()).backward()
        opt.step()
    return {n: p.detach().cpu().reshape(-1).tolist() for n, p in model.named_parameters()}


def parity_worker(ctx, steps: int, batch: int, accum: int, seed: int, lr: float, modes: list[str],
                  inject: dict | None = None) -> dict:
    """In each rank: train every DDP mode from the same start; return the final parameters per mode."""
    device = torch.device(ctx.device)
    n, shard = ctx.world_size, batch // ctx.world_size
    out = {}
    for mode in modes:
        with ctx.phase(f"parity {mode}"):
            model = make_model(seed).to(device)
            ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
            opt = make_optimizer(ddp, lr)
            micro = 1 if mode == "ddp" else accum
            for step in range(steps):
                x, y = global_batch(seed, step, batch)
                x, y = x[ctx.rank * shard:(ctx.rank + 1) * shard].to(device), y[ctx.rank * shard:(ctx.rank + 1) * shard].to(device)
                opt.zero_grad()
                for i, (xm, ym) in enumerate(zip(x.chunk(micro), y.chunk(micro))):
                    sync = mode != "ddp_no_sync" or i == micro - 1
                    with nullcontext() if sync else ddp.no_sync():
                        (nn.functional.mse_loss(ddp(xm), ym) / micro).backward()
                opt.step()
                if inject and inject["rank"] == ctx.rank and step == 0:
                    with torch.no_grad():
                        dict(model.named_parameters())[inject["param"]].view(-1)[0] += inject["amount"]
            out[mode] = {name: p.detach().cpu().reshape(-1).tolist() for name, p in model.named_parameters()}
    return {"params": out, "world_size": n}


def compare(ref: dict[str, list[float]], per_rank: dict[int, dict[str, list[float]]], rtol: float, atol: float) -> dict:
    """Per parameter: max |diff| and max relative diff over ranks, the worst rank; pass/fail; replicas identical."""
    params, passed, worst_abs = [], True, 0.0
    ranks = sorted(per_rank)
    for name, values in ref.items():
        r = torch.tensor(values, dtype=torch.float64)
        best = None
        for rank in ranks:
            t = torch.tensor(per_rank[rank][name], dtype=torch.float64)
            diff = (t - r).abs()
            abs_d = float(diff.max()) if diff.numel() else 0.0
            rel_d = float((diff / r.abs().clamp_min(atol)).max()) if diff.numel() else 0.0
            ok = bool((diff <= atol + rtol * r.abs()).all())
            if best is None or abs_d > best["max_abs_diff"]:
                best = {"name": name, "max_abs_diff": abs_d, "max_rel_diff": rel_d, "worst_rank": rank, "ok": ok}
            elif not ok:
                best["ok"] = False
            passed &= ok
        params.append(best)
        worst_abs = max(worst_abs, best["max_abs_diff"])
    identical = all(per_rank[q] == per_rank[ranks[0]] for q in ranks[1:])
    bad_ranks = sorted({p["worst_rank"] for p in params if not p["ok"]})
    worst = max(params, key=lambda p: p["max_abs_diff"]) if params else None
    return {"status": "pass" if passed and identical else "fail", "max_abs_diff": worst_abs,
            "worst_rank": worst["worst_rank"] if worst else None, "ranks_identical": identical,
            "failing_ranks": bad_ranks, "params": params}


def run_parity(cfg, steps: int, batch: int | None, accum: int, seed: int, lr: float, rtol: float, atol: float,
               inject: str | None) -> dict | None:
    n = resolve_nproc(cfg)
    batch = batch or 8 * n * accum
    if batch % (n * accum):
        raise InputError("--batch", f"{batch} does not split into {n} ranks x {accum} micro-batches")
    inj = _parse_inject(inject, n, seed)
    modes = ["ddp", "ddp_grad_accum", "ddp_no_sync"]
    result = run_job("distdoctor.health.parity:parity_worker",
                     {"steps": steps, "batch": batch, "accum": accum, "seed": seed, "lr": lr, "modes": modes,
                      "inject": inj}, cfg)
    if not result.is_reporter:
        return None
    doc = {"passed": False, "world_size": result.world_size, "backend": result.backend, "device": result.device,
           "steps": steps, "global_batch": batch, "accum": accum, "rtol": rtol, "atol": atol, "inject": inject,
           "runs": []}
    if not result.ok:
        doc["lost"] = [lost.describe() for lost in result.lost]
        doc["errors"] = {str(r): e for r, e in result.errors.items()}
        return doc
    ref = reference(steps, batch, seed, lr)
    for mode in modes:
        cmp = compare(ref, {r: v["params"][mode] for r, v in result.results.items()}, rtol, atol)
        doc["runs"].append({"mode": mode, "reason": "", **cmp})
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2:
        cmp = compare(ref, {0: data_parallel(steps, batch, seed, lr)}, rtol, atol)
        doc["runs"].append({"mode": "data_parallel", "reason": f"nn.DataParallel over {gpus} GPUs", **cmp})
    else:
        doc["runs"].append({"mode": "data_parallel", "status": "skipped", "reason": f"needs >= 2 GPUs, found {gpus}",
                            "max_abs_diff": None, "worst_rank": None, "ranks_identical": None, "failing_ranks": [],
                            "params": []})
    doc["passed"] = all(r["status"] != "fail" for r in doc["runs"])
    return doc


def _parse_inject(spec: str | None, n: int, seed: int) -> dict | None:
    """`drift:RANK[:PARAM]` (or the older `drift:RANK:AMOUNT`) -> which rank moves which parameter by how much."""
    if not spec:
        return None
    fault = parse_fault(spec, PARITY_KINDS, world_size=n)
    names = [name for name, _ in make_model(seed).named_parameters()]
    param = fault.arg if isinstance(fault.arg, str) else names[0]
    if param not in names:
        raise InputError(f"--inject {spec}", f"no parameter named {param!r} (parameters: {', '.join(names)})")
    return {"rank": fault.rank, "param": param, "amount": fault.arg if isinstance(fault.arg, float) else DRIFT}


def render_text(doc: dict) -> str:
    lines = [f"parity {'PASSED' if doc['passed'] else 'FAILED'}: {doc['world_size']} ranks ({doc['backend']}), "
             f"{doc['steps']} steps, global batch {doc['global_batch']}, accumulation {doc['accum']}, "
             f"float64, tolerance {doc['atol']:g} + {doc['rtol']:g}*|x|"]
    for lost in doc.get("lost", []):
        lines.append(f"  lost: {lost}")
    for rank, err in doc.get("errors", {}).items():
        lines.append(f"  rank {rank}: {err}")
    for run in doc["runs"]:
        if run["status"] == "skipped":
            lines.append(f"  {run['mode']:<15} skipped: {run['reason']}")
            continue
        extra = "" if run["ranks_identical"] else "; replicas are NOT bit-identical"
        who = f"; beyond tolerance on rank(s) {run['failing_ranks']}" if run["failing_ranks"] else ""
        lines.append(f"  {run['mode']:<15} {run['status']}: max |diff| {run['max_abs_diff']:.3g} on rank "
                     f"{run['worst_rank']}{who}{extra}")
        for p in run["params"]:
            mark = "" if p["ok"] else "   <-- beyond tolerance"
            lines.append(f"      {p['name']:<12} max |diff| {p['max_abs_diff']:.3g}  rel {p['max_rel_diff']:.3g}  "
                         f"(rank {p['worst_rank']}){mark}")
    return "\n".join(lines)


@click.command("parity")
@world_options
@click.option("--steps", type=count("steps", 1, 100_000), default=5, show_default=True, help="Training steps K.")
@click.option("--batch", type=count("samples", 1, 1 << 20), default=None,
              help="Global batch B per step (default 8 x nproc x accum); must split evenly.")
@click.option("--accum", type=count("micro-batches", 2, 1 << 16), default=2, show_default=True,
              help="Micro-batches per step in the gradient-accumulation and no_sync runs.")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Seed of the model's initial weights and of the training batches.")
@click.option("--lr", type=Number("(learning rate)", 0, 1e6, low_open=True), default=0.1, show_default=True,
              help="SGD learning rate of every run (> 0).")
@click.option("--rtol", type=Number("(relative)", 0, 1e6), default=1e-10, show_default=True,
              help="Relative tolerance of the parameter comparison with the one-process run (>= 0).")
@click.option("--atol", type=Number("(absolute)", 0, 1e30), default=1e-12, show_default=True,
              help="Absolute tolerance of the parameter comparison with the one-process run (>= 0).")
@click.option("--inject", default=None, metavar="drift:RANK[:PARAM]",
              help="Move one element of PARAM (default: the first weight) on RANK after step 1, which must fail. "
                   "drift:RANK:AMOUNT moves the first weight by AMOUNT.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON document on stdout and nothing else there.")
def parity_command(steps, batch, accum, seed, lr, rtol, atol, inject, fmt, **world):
    """DDP (plain, accumulated, no_sync) and DataParallel give the parameters of one process on the whole batch."""
    cfg = config_from_options(**world)
    doc = run_parity(cfg, steps, batch, accum, seed, lr, rtol, atol, inject)
    if doc is None:
        return
    click.echo(json.dumps(doc) if fmt == "json" else render_text(doc))
    if not doc["passed"]:
        raise CheckFailed(1)
