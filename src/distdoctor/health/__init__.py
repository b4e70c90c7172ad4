"""Training health: a live monitor for training loops, measured scaling, and data-parallel parity."""

from distdoctor.health.events import HealthEvent, read_events
from distdoctor.health.monitor import HealthMonitor

__all__ = ["HealthMonitor", "HealthEvent", "read_events"]
