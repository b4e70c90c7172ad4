"""One rank (world size 1) records many calls, then raises; the test sends SIGTERM the moment it says so, while
the recorder is still writing the exception's dump (a big buffer makes that take a while): what torchrun does
to a rank whose neighbour failed first. The exception's dump must land, and the process must still end."""

import sys
import time

import torch
import torch.distributed as dist

import distdoctor.recorder as recorder

recorder.enable(hang_timeout=0, buffer_size=60000)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1)
x = torch.ones(1)
for _ in range(int(sys.argv[2])):
    dist.all_reduce(x)
print("raising", flush=True)
time.sleep(0.05)  # let the test's SIGTERM be on its way; the handler runs inside the dump below
raise ValueError("bad batch 7")
