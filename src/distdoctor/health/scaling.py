"""`distdoctor scaling`: measured data-parallel scaling of a small real model, and a projection beyond.

Measured: for world sizes 1, 2, 4, ... up to --max-ranks (default: the GPUs, or the CPU cores), one job per
size trains an MLP (--layers x --hidden, float32, SGD) with DDP:
  - weak scaling: --batch samples per rank; strong scaling: --global-batch samples split over the ranks;
  - step time: K timed steps after warm-up, the slowest rank's time (what the job sees);
  - compute time: the same steps under `no_sync()` (no gradient all-reduce at all);
  - exposed all-reduce = step - compute: the part of the gradient all-reduce not hidden behind backward;
  - efficiency(n) = samples/s at n / (n x samples/s on one process without DDP).
One rank uses one process without DDP (the baseline people compare with). Every rank gets the same number
of CPU threads at every size (cores / max ranks), so a bigger world does not win or lose by threading.

Projected: an alpha-beta all-reduce model fitted from `distdoctor bench` all_reduce rows (its bench_worker,
run inside the job of the largest measured world; see distdoctor.health.projection), with the measured compute time; points for 8 ... 1024 ranks carry
`"projected": true` and are kept in their own list, never mixed with the measured ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import click
import torch
import torch.distributed as dist
import torch.nn as nn

from distdoctor.errors import CheckFailed, InputError
from distdoctor.health.projection import fit_alpha_beta, project
from distdoctor.options import count
from distdoctor.world import WorldConfig, world_options
from distdoctor.world.config import MAX_NPROC

PROJECT_TO = [2**k for k in range(1, 11)]  # 2 ... 1024


def make_model(layers: int, hidden: int) -> nn.Module:
    mods: list[nn.Module] = []
    for _ in range(layers):
        mods += [nn.Linear(hidden, hidden), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def _timed_steps(model, opt, x, y, steps: int, sync: bool, ddp) -> float:
    """Seconds for `steps` steps on the slowest rank (with or without the gradient all-reduce)."""
    ctx = ddp.no_sync if (ddp is not None and not sync) else None
    if dist.is_initialized():
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(set_to_none=False)
        if ctx is not None:
            with ctx():
                nn.functional.mse_loss(model(x), y).backward()
        else:
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if x.is_cuda:
        torch.cuda.synchronize()
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    if dist.is_initialized():
        dev = x.device if x.is_cuda else torch.device("cpu")
        elapsed = elapsed.to(dev)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def _measure(ctx, mode: str, batch: int, layers: int, hidden: int, steps: int, warmup: int) -> dict:
    device = torch.device(ctx.device)
    torch.manual_seed(0)
    model = make_model(layers, hidden).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None) \
        if ctx.world_size > 1 else None
    net = ddp or model
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(ctx.rank)
    x = torch.randn(batch, hidden, generator=g).to(device)
    y = torch.randn(batch, hidden, generator=g).to(device)
    with ctx.phase(f"scaling {mode} warm-up"):
        _timed_steps(net, opt, x, y, warmup, True, ddp)
    with ctx.phase(f"scaling {mode} timed"):
        step_s = _timed_steps(net, opt, x, y, steps, True, ddp) / steps
    with ctx.phase(f"scaling {mode} compute only"):
        compute_s = _timed_steps(net, opt, x, y, steps, False, ddp) / steps if ddp is not None else step_s
    exposed = max(0.0, step_s - compute_s)
    return {"world_size": ctx.world_size, "mode": mode, "per_rank_batch": batch, "global_batch": batch * ctx.world_size,
            "samples_per_s": batch * ctx.world_size / step_s, "step_ms": step_s * 1e3, "compute_ms": min(compute_s, step_s) * 1e3,
            "exposed_allreduce_ms": exposed * 1e3, "exposed_allreduce_share": exposed / step_s, "projected": False}


def sweep_options(grad_bytes: int, iters: int):
    """The all_reduce sweep the alpha-beta fit uses: distdoctor bench's own rows, 4 KiB .. 4x the gradient."""
    from distdoctor.bench.sweep import BenchOptions

    return BenchOptions(op="all_reduce", dtype="float32", minbytes=4096, maxbytes=max(4096, 4 * grad_bytes),
                        stepfactor=4, iters=iters, warmup=2, check=False)


def scaling_worker(ctx, batch: int, global_batch: int, layers: int, hidden: int, steps: int, warmup: int,
                   threads: int, sweep: bool, sweep_iters: int) -> dict:
    if device_is_cpu(ctx.device):
        torch.set_num_threads(threads)
    out = {"points": [_measure(ctx, "weak", batch, layers, hidden, steps, warmup)]}
    if global_batch % ctx.world_size == 0:
        out["points"].append(_measure(ctx, "strong", global_batch // ctx.world_size, layers, hidden, steps, warmup))
        out["points"][-1]["global_batch"] = global_batch
    grad_bytes = sum(p.numel() * p.element_size() for p in make_model(layers, hidden).parameters())
    out["grad_bytes"] = grad_bytes
    if sweep and ctx.world_size > 1:
        from distdoctor.bench.sweep import bench_worker

        # the rows go out through ctx.emit, exactly as `distdoctor bench` produces them
        bench_worker(ctx, **sweep_options(grad_bytes, sweep_iters).worker_args())
        out["swept"] = True
    return out


def device_is_cpu(device) -> bool:
    return str(device).startswith("cpu")


def run_scaling(cfg: WorldConfig, max_ranks: int, batch: int, global_batch: int, layers: int, hidden: int,
                steps: int, warmup: int, log=lambda msg: None) -> dict:
    from distdoctor.world import run_job

    sizes = [n for n in (2**k for k in range(11)) if n <= max_ranks]
    threads = max(1, (os.cpu_count() or 1) // max_ranks)
    doc = {"max_ranks": max_ranks, "world_sizes": sizes, "model": {"layers": layers, "hidden": hidden},
           "per_rank_batch": batch, "global_batch": global_batch, "steps": steps, "threads_per_rank": threads,
           "measured": [], "projected": [], "alpha_beta": None, "errors": []}
    for n in sizes:
        log(f"measuring {n} rank(s)")
        args = {"batch": batch, "global_batch": global_batch, "layers": layers, "hidden": hidden, "steps": steps,
                "warmup": warmup, "threads": threads, "sweep": n == sizes[-1], "sweep_iters": max(3, steps)}
        res = run_job("distdoctor.health.scaling:scaling_worker", args, dataclasses.replace(cfg, nproc=n))
        if not res.is_reporter:
            return None
        if not res.ok:
            why = "; ".join([lost.describe() for lost in res.lost] + [f"rank {r}: {e}" for r, e in res.errors.items()])
            doc["errors"].append(f"world size {n}: {why or 'failed'}")
            break
        doc["backend"], doc["device"] = res.backend, res.device
        value = res.results[min(res.results)]
        doc["model"]["grad_bytes"] = value["grad_bytes"]
        doc["measured"] += value["points"]
        if value.get("swept"):
            from distdoctor.bench.sweep import summarize_bench

            bench = summarize_bench(res, sweep_options(value["grad_bytes"], args["sweep_iters"]))
            by_size = {}  # one row per size, out-of-place where bench has both
            for r in sorted(bench["rows"], key=lambda r: not r["inplace"]):
                by_size[r["size_bytes"]] = {k: r[k] for k in ("op", "size_bytes", "time_us", "busbw_gbps", "inplace")}
            doc["sweep"] = [by_size[k] for k in sorted(by_size)]
    base = {m["mode"]: m for m in doc["measured"] if m["world_size"] == 1}
    for m in doc["measured"]:
        m["efficiency"] = m["samples_per_s"] / (m["world_size"] * base[m["mode"]]["samples_per_s"]) if m["mode"] in base else None
    if doc.get("sweep") and len(sizes) > 1 and not doc["errors"]:
        fit = fit_alpha_beta(doc["sweep"], sizes[-1])
        fit["source"] = f"distdoctor bench all_reduce rows on {sizes[-1]} ranks"
        doc["alpha_beta"] = fit
        doc["projected"] = project(doc["measured"], fit, doc["model"]["grad_bytes"],
                                   [n for n in PROJECT_TO if n > sizes[-1]])
    return doc


def render_text(doc: dict) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"data-parallel scaling ({doc.get('backend', '?')}, MLP {doc['model']['layers']}x"
                        f"{doc['model']['hidden']}, gradient {doc['model'].get('grad_bytes', 0) / 2**20:.1f} MiB)")
    for col in ("ranks", "mode", "batch/rank", "samples/s", "step ms", "compute ms", "exposed all-reduce", "efficiency", "source"):
        table.add_column(col, justify="right")
    for p in doc["measured"] + doc["projected"]:
        eff = "-" if p.get("efficiency") is None else f"{100 * p['efficiency']:.1f}%"
        table.add_row(str(p["world_size"]), p["mode"], f"{p['per_rank_batch']:g}", f"{p['samples_per_s']:.1f}",
                      f"{p['step_ms']:.2f}", f"{p['compute_ms']:.2f}", f"{100 * p['exposed_allreduce_share']:.1f}%",
                      eff, "projected" if p["projected"] else "measured")
    console = Console(record=True, width=130, file=StringIO(), force_jupyter=False)  # text, even in a notebook
    console.print(table)
    ab = doc.get("alpha_beta")
    if ab:
        console.print(f"projection: all-reduce alpha {ab['alpha_us']:.1f} us per ring step, bus bandwidth "
                      f"{ab['busbw_gbps']:.3g} GB/s (fit on {ab['fit_world_size']} ranks, {ab['points']} sizes, "
                      f"r2 {ab['r2']:.3f}; {ab['source']}); one ring all-reduce per step, compute as measured")
    for err in doc["errors"]:
        console.print(f"[red]error:[/red] {err}")
    if doc.get("png"):
        console.print(f"plot: {doc['png']}")
    return console.export_text()


def write_png(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, tab) = plt.subplots(2, 1, figsize=(9, 8), gridspec_kw={"height_ratios": [3, 2]})
    colors = {"weak": "tab:blue", "strong": "tab:orange"}
    for mode, color in colors.items():
        meas = [p for p in doc["measured"] if p["mode"] == mode and p.get("efficiency") is not None]
        proj = [p for p in doc["projected"] if p["mode"] == mode]
        if meas:
            ax.plot([p["world_size"] for p in meas], [100 * p["efficiency"] for p in meas], "o-", color=color,
                    label=f"{mode} scaling, measured", zorder=3)
        if proj:
            xs = [meas[-1]["world_size"]] + [p["world_size"] for p in proj] if meas else [p["world_size"] for p in proj]
            ys = ([100 * meas[-1]["efficiency"]] if meas else []) + [100 * p["efficiency"] for p in proj]
            ax.plot(xs, ys, "o--", color=color, markerfacecolor="white", label=f"{mode} scaling, projected")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_ylim(0, 110)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("measured vs projected data-parallel scaling efficiency")
    rows = [[str(p["world_size"]), p["mode"], f"{p['samples_per_s']:.0f}", f"{100 * p['exposed_allreduce_share']:.0f}%",
             "-" if p.get("efficiency") is None else f"{100 * p['efficiency']:.0f}%",
             "projected" if p["projected"] else "measured"]
            for p in doc["measured"] + [q for q in doc["projected"] if q["world_size"] in (8, 64, 1024)]]
    tab.axis("off")
    if rows:
        t = tab.table(cellText=rows, colLabels=["ranks", "mode", "samples/s", "exposed all-reduce", "efficiency", "source"],
                      loc="center")
        t.auto_set_font_size(False)
        t.set_fontsize(9)
        t.scale(1, 1.2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


@click.command("scaling")
@world_options
@click.option("--max-ranks", type=count("ranks", 1, MAX_NPROC), default=None,
              help="Largest world measured (default: the GPUs if >= 2, else the CPU cores).")
@click.option("--batch", type=count("samples", 1, 1 << 20), default=32, show_default=True, help="Weak scaling: samples per rank.")
@click.option("--global-batch", type=count("samples", 1, 1 << 20), default=64, show_default=True,
              help="Strong scaling: samples per step over all ranks.")
@click.option("--layers", type=count("layers", 1, 1024), default=4, show_default=True,
              help="Linear layers of the measured model (more: more gradient to all-reduce).")
@click.option("--hidden", type=count("features", 1, 1 << 16), default=1024, show_default=True,
              help="Width of each layer (hidden x hidden weights).")
@click.option("--steps", type=count("steps", 1, 100_000), default=10, show_default=True, help="Timed steps per measurement.")
@click.option("--warmup", type=count("steps", 0, 100_000), default=3, show_default=True,
              help="Untimed steps before each measurement.")
@click.option("--png", "png", default=None, type=click.Path(dir_okay=False), help="Write the plot and table here.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON document on stdout and nothing else there.")
def scaling_command(max_ranks, batch, global_batch, layers, hidden, steps, warmup, png, fmt, **world):
    """Measured and projected data-parallel scaling efficiency of a small real model."""
    if world.get("nproc") is not None:
        raise InputError("--nproc", "scaling chooses the world sizes itself; use --max-ranks")
    from distdoctor.world import under_launcher

    if under_launcher():
        raise InputError("scaling", "it starts its own worlds of 1, 2, 4, ... ranks; run it without torchrun")
    cfg_world = {k: v for k, v in world.items() if k != "nproc"}
    from distdoctor.world import config_from_options, gpu_count

    cfg = config_from_options(nproc=None, **cfg_world)
    if max_ranks is None:
        gpus = gpu_count()
        max_ranks = gpus if gpus >= 2 else (os.cpu_count() or 1)
    if png:
        parent = os.path.dirname(os.path.abspath(png))
        if not os.path.isdir(parent):
            raise InputError("--png", f"directory {parent} does not exist")
    doc = run_scaling(cfg, max_ranks, batch, global_batch, layers, hidden, steps, warmup,
                      log=lambda msg: click.echo(f"distdoctor scaling: {msg}", err=True))
    if doc is None:
        return
    if png and doc["measured"]:
        write_png(doc, png)
        doc["png"] = os.path.abspath(png)
    click.echo(json.dumps(doc) if fmt == "json" else render_text(doc))
    if doc["errors"] or not doc["measured"]:
        raise CheckFailed(1)
