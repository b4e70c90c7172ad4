"""Three gloo ranks with the recorder on and DISTDOCTOR_INJECT in their environment (the test sets it as
`distdoctor run --inject` does): four steps of all_reduce (world), broadcast from rank 0, send 0 -> 1, an
optimizer step; a thread named `loader` runs beside. Every rank dumps at exit; a short gloo timeout ends a hang."""

import datetime
import os
import threading
import time

import distdoctor.recorder

distdoctor.recorder.enable(hang_timeout=0, dump_on_exit=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("GLOO_TIMEOUT", "8"))))
rank = dist.get_rank()


def loader():
    while True:
        time.sleep(0.02)


th = threading.Thread(target=loader, name="loader", daemon=True)
th.start()
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    if rank == 0:
        dist.send(t, 1)
    elif rank == 1:
        dist.recv(t, 0)
    model(torch.ones(2)).sum().backward()
    opt.step()
    time.sleep(0.05)
    print(f"STEP {step} loader_alive={th.is_alive()}", flush=True)
dist.barrier()
dist.destroy_process_group()
