"""The world: a set of ranks to run one function on, started here or joined from a launcher.

job (run_job, what comes back, the worker context), standalone (start local workers) and launched (be one
rank of torchrun's, srun's or mpirun's world), launchers (what each launcher tells a rank), env (what this
machine offers). Other stages import the public names below; the modules of this package import each other
by their own names.
"""

from distdoctor.world.job import (BACKENDS, JobResult, LostRank, WorkerContext, WorldConfig, config_from_options,
                                  free_port, interface_address, interfaces, pick_iface, resolve_backend,
                                  resolve_nproc, run_job, under_launcher, world_options)

__all__ = ["BACKENDS", "JobResult", "LostRank", "WorkerContext", "WorldConfig", "config_from_options", "free_port",
           "interface_address", "interfaces", "pick_iface", "resolve_backend", "resolve_nproc", "run_job",
           "under_launcher", "world_options"]
