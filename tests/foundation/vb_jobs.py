"""Worker functions the bench/validate tests run in real ranks: several jobs in one world, as `check` does."""

from distdoctor.bench import bench_worker
from distdoctor.validate import validate_worker


def validate_then_bench(ctx, validate, bench_ops, bench):
    return {"validate": validate_worker(ctx, **validate),
            "bench": {op: bench_worker(ctx, op=op, **bench) for op in bench_ops}}
