"""2 ranks: rank 0 leaves while its irecv from rank 1 is still pending (rank 1 never sends).

The world comes from init_device_mesh, which calls an init_process_group it imported before the recorder
patched anything: the recorder must notice the process group at the first collective.
"""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import distdoctor.recorder as recorder

recorder.enable(hang_timeout=0)
init_device_mesh("cpu", (2,))
dist.barrier()
if dist.get_rank() == 0:
    work = dist.irecv(torch.empty(1), src=1)
sys.exit(0)
