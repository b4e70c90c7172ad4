"""Worker functions the bench/validate tests run in real ranks: several jobs in one world, as `check` does."""

from distdoctor.bench.sweep import bench_worker
from distdoctor.validate.sweep import validate_worker


def validate_then_bench(ctx, validate, bench_ops, bench):
    return {"validate": validate_worker(ctx, **validate),
            "bench": {op: bench_worker(ctx, op=op, **bench) for op in bench_ops}}


def links_losing_rank(ctx, victim, nbytes, iters):
    """bench --links' probe, with `victim` exiting as it starts its first timed transfer (mid-probe)."""
    import os

    from distdoctor.bench import links as bench_links

    if ctx.rank == victim:
        def die(*args, **kwargs):
            os._exit(7)

        bench_links._one_way = die
    return bench_links.links_worker(ctx, nbytes, iters)
