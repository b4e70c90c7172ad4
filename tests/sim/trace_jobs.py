"""Small real 4-rank Gloo jobs for `distdoctor sim from-trace`: two latent hazards that complete on Gloo, each
with its fixed twin. Run through tests/doctor/real/jobs.py's launcher (forked ranks, Flight Recorder dumps):

    distdoctor run --dump-dir DIR/recorder --dump-on-exit -- python tests/sim/trace_jobs.py --out DIR --scenario NAME

- `groups_inverted`: ranks 0-1 issue async all_reduces on groups `a` then `b`, ranks 2-3 on `b` then `a`, and
  then wait for both. Gloo runs each process group on its own threads, so the job completes; on one shared
  communication stream (`--streams shared`) the ranks deadlock. `groups_same_order`: every rank `a` then `b`.
- `p2p_send_first`: a 4-stage pipeline whose neighbours then exchange activations and gradients, both sides
  sending first (`isend`, then a blocking `recv`, then waiting for the send). Gloo posts the send and moves on,
  so it completes; where a send must meet its receive before the next op of the pair's stream runs (NCCL's
  one stream per peer pair, messages above its buffers: `--eager-bytes 0`) it deadlocks. `p2p_parity`: even
  stages send first, odd stages receive first, with blocking calls.
- `latent_hazards` runs both hazards one after the other, `fixed_twins` both fixed twins.
"""

from __future__ import annotations

import os
import sys
import time

STEPS = 6
HERE = os.path.dirname(os.path.abspath(__file__))


def _compute(seconds: float) -> None:
    time.sleep(seconds)  # the "training compute" between calls: measured as a gap, costs no CPU


def _groups(ctx, inverted: bool) -> None:
    import torch
    import torch.distributed as dist

    a = dist.new_group(list(range(ctx.world)), timeout=ctx.pg_timeout)
    b = dist.new_group(list(range(ctx.world)), timeout=ctx.pg_timeout)
    x, y = torch.ones(64), torch.ones(64)
    for _ in range(STEPS):
        _compute(0.002)
        first, second = (b, a) if inverted and ctx.rank >= ctx.world // 2 else (a, b)
        w1 = dist.all_reduce(x, group=first, async_op=True)  # issued: first
        w2 = dist.all_reduce(y, group=second, async_op=True)  # issued: second
        _compute(0.002)
        w1.wait()
        w2.wait()
        dist.all_reduce(x)  # the step's loss, on the world group
        ctx.step_done()


def groups_inverted(ctx) -> None:
    _groups(ctx, inverted=True)


def groups_same_order(ctx) -> None:
    _groups(ctx, inverted=False)


def _pipeline(ctx, parity: bool) -> None:
    import torch
    import torch.distributed as dist

    r, n = ctx.rank, ctx.world
    act, grad = torch.ones(32), torch.ones(32)
    for _ in range(STEPS):
        # forward then backward through the chain, then the steady-state exchange between neighbours
        if r > 0:
            dist.recv(act, r - 1)
        _compute(0.002)
        if r < n - 1:
            dist.send(act, r + 1)
            dist.recv(grad, r + 1)
        _compute(0.003)
        if r > 0:
            dist.send(grad, r - 1)
        for peer in (p for p in (r - 1, r + 1) if 0 <= p < n):
            if parity and r % 2:
                dist.recv(grad, peer)
                dist.send(act, peer)
            else:  # isend: Gloo posts it and returns; the recv below is what pairs with the peer's isend
                work = dist.isend(act, peer)
                dist.recv(grad, peer)
                work.wait()
        ctx.step_done()


def p2p_send_first(ctx) -> None:
    _pipeline(ctx, parity=False)


def p2p_parity(ctx) -> None:
    _pipeline(ctx, parity=True)


def latent_hazards(ctx) -> None:
    """Both hazards in one run (what the tests record: one job start instead of two)."""
    _groups(ctx, inverted=True)
    _pipeline(ctx, parity=False)


def fixed_twins(ctx) -> None:
    _groups(ctx, inverted=False)
    _pipeline(ctx, parity=True)


SCENARIOS = ("groups_inverted", "groups_same_order", "p2p_send_first", "p2p_parity", "latent_hazards",
             "fixed_twins")


def main() -> int:
    """jobs.py's launcher with these scenarios registered."""
    import importlib.util

    path = os.path.join(os.path.dirname(HERE), "doctor", "real", "jobs.py")
    spec = importlib.util.spec_from_file_location("distdoctor_real_jobs", path)
    jobs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(jobs)
    jobs.ALL_SCENARIOS.update({name: "trace_jobs" for name in SCENARIOS})  # what its launcher looks up
    sys.path.insert(0, HERE)
    return jobs.main()


if __name__ == "__main__":
    sys.exit(main())
