"""The hang and desync doctor: small analyses over a TraceSet, each asking one question.

match (per-group alignment, first divergence), waitfor (cycles across ranks and groups), p2p (send/recv that
can never pair), progress (where each rank is), straggler (late arrivals), analyze (runs them, root cause first).
"""

from distdoctor.diagnose.analyze import Report, analyze
from distdoctor.findings.kinds import KINDS, Finding

__all__ = ["analyze", "Report", "Finding", "KINDS"]
