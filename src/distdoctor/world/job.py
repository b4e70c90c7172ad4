"""Get a world of ranks, run one function in every rank, and bring back what each rank computed.

Two ways to get a world, one code path after it:

- standalone (no RANK/WORLD_SIZE in the environment): start `nproc` local workers with torch's own elastic
  launcher (`torch.distributed.launcher.api.elastic_launch`, c10d rendezvous on 127.0.0.1 and a free port,
  max_restarts=0). The parent process is the reporter. Each worker streams what it does to its own append-only
  file in a private run directory (its phase, `ctx.emit` records, progress); a file survives the worker's hard
  death, so nothing computed is lost and the parent can say what a dead rank was doing.
- under an existing launcher (`torchrun … -m distdoctor validate`): this process is one rank. Phases, records,
  a heartbeat and the final result go to the process group's store (the launcher's TCPStore), which outlives
  any single worker; rank 0 gathers from it under the timeout and is the only reporter. If rank 0 is gone, the
  lowest surviving rank reports instead.

The standalone machinery is in `standalone.py`, the launcher side in `launched.py`; both return a JobResult
(result.py) and name lost ranks with the one policy of blame.py (docs/world.md).

Guarantees: every collective of the harness and of the worker function runs under `timeout_s` (the process
group timeout); survivors stop within timeout_s + 15 s; no worker outlives run_job (the elastic agent stops
the group on the first failure, and a watchdog here kills hung workers).
"""

from __future__ import annotations

from typing import Callable

from distdoctor.world import launched, launchers, standalone
from distdoctor.world.config import WorldConfig
from distdoctor.world.result import JobResult
from distdoctor.world.worker import load_target


def run_job(target: str, args: dict, cfg: WorldConfig, on_event: Callable[[dict], None] | None = None) -> JobResult:
    """Run `target(ctx, **args)` in every rank of a world; return what every rank computed and who was lost."""
    load_target(target)  # fail early, in the caller, on a bad target
    launch = launchers.detect()
    if launch is not None:
        store_path = None
        if launch.kind not in ("torchrun", "env"):  # srun / mpirun: nobody agreed a rendezvous yet
            rdzv = launchers.rendezvous(launch, cfg.master_addr if cfg.master_addr_given else None, cfg.master_port)
            launchers.preflight(launch, rdzv, cfg.timeout_s)
            launchers.export(launch, rdzv)
            store_path = rdzv.store_path
        return launched.run_in_rank(target, args, cfg, on_event, store_path=store_path,
                                     store_in_rank0=launch.kind not in ("torchrun", "env") and store_path is None)
    return standalone.run_standalone(target, args, cfg, on_event)
