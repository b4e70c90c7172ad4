"""A small training job as users write it (run under torchrun by `distdoctor run --inject`): a model, an optimizer,
and per step a broadcast of the batch seed from rank 0 on the world, an all_reduce of the gradients on the world,
an all_reduce of the loss on the rank's pair group ({0, 1}, {2, 3}, ...), and a ring exchange (send to the next
rank, recv from the previous). Prints `STEP n` from rank 0. Usage: drill_job.py [STEPS] [STEP_SECONDS]."""

import sys
import time

import torch
import torch.distributed as dist
# DDP's constructor and an optimizer's first step import torch._dynamo (some 800 modules). Imported here, before the
# process group exists, a rank slow to import it on a loaded machine is slow to start, not a rank that its peers
# wait for inside a collective for longer than `distdoctor run --hang-timeout` allows.
import torch._dynamo  # noqa: F401,E402

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pairs = [dist.new_group([r, r + 1]) for r in range(0, world - 1, 2)]
pair = pairs[rank // 2]
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(steps):
    seed = torch.tensor([step])
    dist.broadcast(seed, src=0)
    torch.manual_seed(int(seed))
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    opt.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total, group=pair)
    out, inc = torch.ones(2) * rank, torch.zeros(2)
    if rank % 2 == 0:
        dist.send(out, (rank + 1) % world)
        dist.recv(inc, (rank - 1) % world)
    else:
        dist.recv(inc, (rank - 1) % world)
        dist.send(out, (rank + 1) % world)
    if rank == 0:
        print(f"STEP {step}", flush=True)
    time.sleep(pause)
dist.barrier()
dist.destroy_process_group()
