"""2 ranks: after a barrier rank 1 leaves with sys.exit(3) (a script's failure path); rank 0 ends normally."""

import sys

import torch.distributed as dist

import distdoctor.recorder as recorder

recorder.enable(hang_timeout=0)
dist.init_process_group("gloo")
dist.barrier()


def give_up():
    sys.exit(3)


if dist.get_rank() == 1:
    give_up()
