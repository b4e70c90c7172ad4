"""Collective bandwidth with nccl-tests' semantics: the sweep (sweep.py), host-to-host links (links.py),
nccl-tests' table and JSON (nccl_tests.py) and comparison with an earlier run (baseline.py)."""

from distdoctor.bench.nccl_tests import format_table
from distdoctor.bench.sweep import BenchOptions, bench_worker, run_bench, summarize_bench

__all__ = ["BenchOptions", "bench_worker", "format_table", "run_bench", "summarize_bench"]
