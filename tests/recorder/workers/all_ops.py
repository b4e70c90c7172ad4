"""Every collective kind and p2p call on 4 gloo ranks, world group and subgroups; then dump.

Writes <dump_dir>/../result_<rank>.json: Flight Recorder's JSON dump (to compare group naming and seq) and
the calls gloo refused on this torch.
"""

import json
import os
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

import distdoctor.recorder as recorder

warnings.simplefilter("ignore")
recorder.enable(hang_timeout=0)  # before init: also turns Flight Recorder on
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 4
refused = {}


def attempt(name, fn):
    try:
        fn()
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        refused[name] = str(exc)[:200]


g01 = dist.new_group([0, 1])
g23 = dist.new_group([2, 3])
mine = g01 if rank < 2 else g23
t = torch.full((5,), float(rank))
dist.all_reduce(t)
dist.broadcast(t, src=2)
dist.reduce(t, dst=1, op=dist.ReduceOp.MAX)
dist.all_gather([torch.empty(5) for _ in range(world)], t)
dist.all_gather_into_tensor(torch.empty(5 * world), t)
dist._all_gather_base(torch.empty(5 * world), t)
attempt("all_gather_coalesced", lambda: dist.all_gather_coalesced([[torch.empty(5)] for _ in range(world)], [t]))
attempt("reduce_scatter", lambda: dist.reduce_scatter(torch.empty(3), [torch.ones(3) for _ in range(world)]))
dist.reduce_scatter_tensor(torch.empty(3), torch.ones(3 * world))
attempt("all_to_all", lambda: dist.all_to_all([torch.empty(2) for _ in range(world)],
                                               [torch.ones(2) for _ in range(world)]))
dist.all_to_all_single(torch.empty(2 * world, dtype=torch.float64), torch.ones(2 * world, dtype=torch.float64))
dist.gather(t, [torch.empty(5) for _ in range(world)] if rank == 3 else None, dst=3)
dist.scatter(t, [torch.ones(5) for _ in range(world)] if rank == 0 else None, src=0)
dist.barrier()
dist.monitored_barrier(timeout=timedelta(seconds=30))
# subgroups: group_src is a group rank, the trace must say the global rank
dist.all_reduce(t, group=mine)
dist.broadcast(t, group=mine, group_src=1)
# async collective + wait
work = dist.all_reduce(torch.ones(7, dtype=torch.int64), async_op=True)
work.wait()
# blocking p2p in a ring: even ranks send first
right, left = (rank + 1) % world, (rank - 1) % world
buf = torch.empty(4)
if rank % 2 == 0:
    dist.send(torch.ones(4), dst=right)
    dist.recv(buf, src=left)
else:
    dist.recv(buf, src=left)
    dist.send(torch.ones(4), dst=right)
# async p2p between pairs
partner = rank ^ 1
req = dist.isend(torch.ones(3), partner) if rank % 2 == 0 else dist.irecv(torch.empty(3), partner)
req.wait()
# batched p2p around the ring
reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), right),
                               dist.P2POp(dist.irecv, torch.empty(2), left)])
for r in reqs:
    r.wait()
# receive from any source: rank 1 learns the peer from torch
if rank == 0:
    dist.send(torch.ones(1), dst=1)
elif rank == 1:
    dist.recv(torch.empty(1))
dist.barrier(group=mine)
# async state as the dump would show it: an irecv whose sender has not sent yet, then after wait()
async_states = []
if rank == 0:
    work = dist.irecv(torch.empty(1), src=1)
    async_states.append(recorder.get_recorder().snapshot("probe").entries[-1].state)
    dist.barrier(group=g01)  # only now does rank 1 send
    work.wait()
    async_states.append(recorder.get_recorder().snapshot("probe").entries[-1].state)
elif rank == 1:
    dist.barrier(group=g01)
    dist.send(torch.ones(1), dst=0)

path = recorder.dump("all ops done")
fr = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(True, False))
Path(os.environ["DISTDOCTOR_DUMP_DIR"]).parent.joinpath(f"result_{rank}.json").write_text(
    json.dumps({"dump": path, "fr_entries": fr.get("entries", []), "refused": refused,
                "async_states": async_states}))
dist.destroy_process_group()
