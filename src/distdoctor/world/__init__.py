"""The world: a set of ranks to run one function on, started here or joined from a launcher.

config (the flags and what follows from them), job (run_job), standalone (start local workers) and launched
(be one rank of torchrun's, srun's or mpirun's world), launchers (what each launcher tells a rank), worker (what
the function in a rank gets), result (what comes back), blame (who is lost and why: one policy for every
world), failures (what an exception's text means: one classifier for every stage), faults (the one fault
injection grammar), lateness (the one straggler rule), env (what this machine offers). Other stages import the
public names below; the modules of this package import each other by their own names.
"""

from distdoctor.world.config import (BACKENDS, WorldConfig, config_from_options, free_port, gpu_count,
                                     interface_address, interfaces, pick_iface, resolve_backend, resolve_nproc,
                                     under_launcher, world_options)
from distdoctor.world.job import run_job
from distdoctor.world.result import JobResult, LostRank
from distdoctor.world.worker import WorkerContext

__all__ = ["BACKENDS", "JobResult", "LostRank", "WorkerContext", "WorldConfig", "config_from_options", "free_port",
           "gpu_count", "interface_address", "interfaces", "pick_iface", "resolve_backend", "resolve_nproc", "run_job",
           "under_launcher", "world_options"]
