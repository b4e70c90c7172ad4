"""2 ranks: rank 0 leaves while its irecv from rank 1 is still pending (rank 1 never sends)."""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import distdoctor.trace as trace

trace.enable(hang_timeout=0)
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
dist.barrier()
if dist.get_rank() == 0:
    work = dist.irecv(torch.empty(1), src=1)
sys.exit(0)
