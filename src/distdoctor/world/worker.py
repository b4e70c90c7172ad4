"""The worker side of every world: what the function running in a rank gets (WorkerContext), how the rank joins
the process group, and how the function is found and its failure put in one line."""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
import time
from typing import Any, Callable

from distdoctor.errors import InputError


class WorkerContext:
    """What the worker function gets: its place in the world and a way to say what it is doing."""

    def __init__(self, rank, world_size, local_rank, backend, device, timeout, channel):
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.backend = backend
        self.device = device
        self.timeout = timeout
        self._channel = channel
        self._phases: list[str] = []
        self.failed_in: str | None = None  # the phase an exception escaped from
        self.stage: str | None = None  # a job made of parts (check: validate, then bench) names the part here

    @property
    def current_phase(self) -> str | None:
        return self._phases[-1] if self._phases else None

    @contextlib.contextmanager
    def phase(self, name: str):
        """Record what this rank is doing right now (e.g. "all_reduce float32 count=262144 group=world").

        Call it at least once per `timeout`: a rank whose phase does not change for longer is taken as hung
        once another rank has finished.
        """
        self._phases.append(name)
        self._channel.send({"type": "phase", "phase": name, "t": time.time()})
        try:
            yield
        except BaseException:
            if self.failed_in is None:  # the innermost phase the error came out of
                self.failed_in = name
            raise
        finally:
            self._phases.pop()
            self._channel.send({"type": "phase", "phase": self.current_phase, "t": time.time()})

    def emit(self, record: Any) -> None:
        """Stream a partial result (JSON-serializable) to the reporter; it is kept even if this rank dies."""
        self._channel.send({"type": "record", "record": record, "t": time.time()})

    def progress(self, done: int, total: int, what: str = "") -> None:
        self._channel.send({"type": "progress", "rank": self.rank, "done": done, "total": total, "what": what,
                            "stage": self.stage, "t": time.time()})

    def new_group(self, ranks: list[int]):
        """A subgroup under the world's timeout (every rank must call this, as with dist.new_group)."""
        import torch.distributed as dist

        return dist.new_group(ranks, timeout=self.timeout)


def load_target(target: str) -> Callable:
    module_name, _, func_name = target.partition(":")
    if not module_name or not func_name:
        raise InputError("target", f"expected 'package.module:function', got {target!r}")
    try:
        return getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise InputError("target", f"cannot load {target!r}: {exc}") from None


def init_process_group(backend: str, timeout_s: float, iface: str | None, store_path: str | None = None):
    """Join the world. With `store_path`, the ranks meet through a FileStore there (one host, nothing listening
    on the network); otherwise through the launcher's environment (MASTER_ADDR/MASTER_PORT, a TCPStore)."""
    import torch
    import torch.distributed as dist

    if iface and backend == "gloo":
        os.environ["GLOO_SOCKET_IFNAME"] = iface
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(seconds=timeout_s)
    join: dict = {"timeout": timeout}
    if store_path:
        world_size = int(os.environ["WORLD_SIZE"])
        join.update(store=dist.FileStore(store_path, world_size), rank=int(os.environ["RANK"]), world_size=world_size)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, **join)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", **join)
    return device, timeout, local_rank


def describe_exception(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"[:500]

