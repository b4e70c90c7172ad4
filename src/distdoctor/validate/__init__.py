"""Collective correctness on real processes: the sweep (sweep.py), the rank-side loop (execute.py) and the
first thing to run on a machine, `check` (check.py)."""

from distdoctor.validate.sweep import ValidateOptions, run_validate, summarize_validate, validate_worker

__all__ = ["ValidateOptions", "run_validate", "summarize_validate", "validate_worker"]
