"""Findings as diagnose reports them: the one vocabulary lives in distdoctor/findings/kinds.py (the simulator
speaks it too); this name stays importable for the code built on it."""

from distdoctor.findings.kinds import (HAZARD_KINDS, KINDS, PRIORITY, PRODUCER_ORDERED, Finding, fmt_group,
                                       fmt_ranks, group_desc)

__all__ = ["HAZARD_KINDS", "KINDS", "PRIORITY", "PRODUCER_ORDERED", "Finding", "fmt_group", "fmt_ranks", "group_desc"]
