"""Ties in groups of two, on real gloo ranks with the recorder on (every rank dumps once stuck 2 s, before gloo's
timeout ends it, or aborts it). Usage: tie_job.py SCENARIO
- siblings: 4 ranks, TP groups {0, 1} and {2, 3} (one per data-parallel replica); each step an all_reduce on the
  rank's TP group; at step 2 rank 0 alone gathers its shard for a log line (an all_gather on its TP group).
- conditional: 2 ranks, one group; at step 2 rank 0 alone all_gathers for a log line, from an `if rank == 0:`.
- blind: 2 ranks; at step 2 each broadcasts from itself (a root read from a per-rank setting); nothing says
  which is odd."""

import datetime
import os
import sys
import threading

import distdoctor.recorder

distdoctor.recorder.enable(hang_timeout=2, suspect_floor=0, dump_on_exit=True)  # dumps while stuck

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

scenario = sys.argv[1]
_ender = threading.Timer(60, os._exit, (3,))  # a rank stuck at exit (gloo threads) ends all the same
_ender.daemon = True
_ender.start()
TIMEOUT = datetime.timedelta(seconds=10)  # new_group does not inherit it: each group is given it too
dist.init_process_group("gloo", timeout=TIMEOUT)
rank, world = dist.get_rank(), dist.get_world_size()
if scenario == "siblings":
    tp_groups = [dist.new_group([r, r + 1], timeout=TIMEOUT, group_desc="tp") for r in range(0, world, 2)]
    tp = tp_groups[rank // 2]
else:
    tp = dist.new_group(list(range(world)), timeout=TIMEOUT, group_desc="tp")
for step in range(4):
    shard = torch.ones(4)
    if step == 2 and scenario == "blind":
        dist.broadcast(shard, src=rank, group=tp)
    if step == 2 and scenario == "siblings" and rank == 0:
        gathered = [torch.empty(4) for _ in range(2)]
        dist.all_gather(gathered, shard, group=tp)
    if step == 2 and scenario == "conditional":
        if rank == 0:
            gathered = [torch.empty(4) for _ in range(world)]
            dist.all_gather(gathered, shard, group=tp)
    dist.all_reduce(shard, group=tp)
