"""`distdoctor env`: what this machine offers a distributed job, and the mode distdoctor will use on it.

Everything comes from torch itself (torch.distributed.is_*_available, torch.cuda, torch.cuda.nccl) and the OS;
nothing is started. The mode follows the world's own rule (distdoctor.world.resolve_backend): NCCL with one GPU
per rank when there are at least two GPUs, otherwise gloo over CPU processes.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys

import click

from distdoctor.cli import FORMAT_OPTION

BACKEND_NAMES = ("gloo", "nccl", "mpi", "ucc", "xccl")


def _backends() -> dict[str, bool]:
    import torch.distributed as dist

    available = {}
    for name in BACKEND_NAMES:
        probe = getattr(dist, f"is_{name}_available", None)
        available[name] = bool(probe()) if probe is not None and dist.is_available() else False
    return available


def _nccl_version() -> str | None:
    import torch

    try:
        if not torch.cuda.is_available():
            return None
        version = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - a CPU build has no NCCL to ask
        return None
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def collect_env() -> dict:
    """The machine as a distributed job sees it (the JSON document of `distdoctor env`)."""
    import torch

    from distdoctor import __version__
    from distdoctor.world.launchers import detect
    from distdoctor.world.config import WorldConfig, pick_iface, resolve_backend, resolve_nproc

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    backends = _backends()
    cfg = WorldConfig()
    nproc = resolve_nproc(cfg)
    launch = detect()
    backend = resolve_backend(cfg, (launch.local_world_size or launch.world_size) if launch else nproc)
    mode = "nccl: real multi-GPU" if backend == "nccl" else "gloo: CPU processes"
    try:
        usable_cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        usable_cpus = os.cpu_count()
    env = {
        "distdoctor_version": __version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "backends": backends,
        "available_backends": [name for name, ok in backends.items() if ok],
        "device_type": "cuda" if gpus else "cpu",
        "device_count": gpus,
        "device_names": names,
        "cuda_version": torch.version.cuda,
        "nccl_version": _nccl_version(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": usable_cpus,
        "mode": mode,
        "default_backend": backend,
        "default_nproc": nproc,
        "launcher": "external" if launch else "standalone",
        # which one: standalone, torchrun, env (RANK/WORLD_SIZE from another launcher), slurm, openmpi, mpich
        "launcher_kind": launch.kind if launch else "standalone",
        "gloo_iface": pick_iface(os.environ.get("MASTER_ADDR", cfg.master_addr)) if backend == "gloo" else None,
    }
    if launch:
        env["rank"] = launch.rank
        env["world_size"] = launch.world_size
        env["local_rank"] = launch.local_rank
        env["local_world_size"] = launch.local_world_size
        env["master_addr"] = os.environ.get("MASTER_ADDR")
        env["launch"] = launch.to_json()
        env["rendezvous"] = _rendezvous(launch)
    return env


def _rendezvous(launch) -> str:
    """Where this world's ranks would meet (no socket is opened)."""
    from distdoctor.errors import InputError
    from distdoctor.world.launchers import rendezvous

    if launch.kind in ("torchrun", "env"):
        return f"the launcher's, at {os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    try:
        return rendezvous(launch, None, None).describe()
    except InputError as exc:
        return f"undecided: {exc}"


def format_env(env: dict) -> str:
    backends = ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in env["backends"].items())
    devices = f"{env['device_count']} x {env['device_type']}"
    if env["device_names"]:
        devices += " (" + ", ".join(env["device_names"]) + ")"
    rows = [
        ("mode", f"{env['mode']} ({env['default_nproc']} ranks by default)"),
        ("torch", env["torch_version"] + (f" (CUDA {env['cuda_version']})" if env["cuda_version"] else " (CPU build)")),
        ("backends", backends),
        ("devices", devices if env["device_count"] else "no GPU"),
        ("nccl", env["nccl_version"] or "not present"),
        ("cpus", f"{env['cpu_count']} ({env['usable_cpus']} usable by this process)"),
        ("gloo iface", env["gloo_iface"] or "-"),
        ("launcher", _launcher_line(env)),
        ("python", f"{env['python_version']} on {env['platform']}"),
        ("host", env["hostname"]),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _launcher_line(env: dict) -> str:
    if "rank" not in env:
        return "standalone (distdoctor starts its own ranks)"
    names = {"torchrun": "torchrun", "env": "RANK/WORLD_SIZE set by a launcher", "slurm": "SLURM srun",
             "openmpi": "OpenMPI mpirun", "mpich": "MPICH/Hydra mpiexec"}
    local = f", local rank {env['local_rank']}" if env.get("local_rank") is not None else ""
    return (f"{names.get(env['launcher_kind'], env['launcher_kind'])} (rank {env['rank']} of {env['world_size']}"
            f"{local}); rendezvous: {env['rendezvous']}")


@click.command("env")
@FORMAT_OPTION
def env_command(fmt: str) -> None:
    """Torch version, backends, devices and the mode distdoctor will use."""
    env = collect_env()
    if env.get("rank", 0) != 0:
        return  # under torchrun only rank 0 reports
    if fmt == "json":
        sys.stdout.write(json.dumps(env, indent=2) + "\n")
    else:
        click.echo(format_env(env))
