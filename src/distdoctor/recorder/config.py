"""The recorder's settings: explicit arguments to enable() win over the DISTDOCTOR_* environment that
`distdoctor run` sets, which wins over the defaults. A malformed variable is a warning and its default, never a
crash of the training process."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from distdoctor.recorder.layout import LAYOUTS

DEFAULT_BUFFER = 2000
DEFAULT_HANG_TIMEOUT = 300.0
# start-up (until every rank has issued its first collective: one may still be importing torch or building the
# model) is held to max(this, the hang timeout), not to the hang timeout (hangwatch.py)
DEFAULT_START_TIMEOUT = 600.0
DEFAULT_SUSPECT_FLOOR = 10.0  # a hang is suspected after max(floor, factor x the longest recent collective wait)
DEFAULT_SUSPECT_FACTOR = 3.0
DEFAULT_DUMP_DIR = "distdoctor-dumps"
CALLER_FRAMES = 4
INJECT_ENV = "DISTDOCTOR_INJECT"  # `run --inject`: the fault specs, a JSON list (recorder/inject.py plants them)


def warn(message: str) -> None:
    print(f"distdoctor.recorder: warning: {message}", file=sys.stderr, flush=True)


def _env_number(name: str, kind, default):
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = kind(raw)
        if value < 0:
            raise ValueError
        return value
    except ValueError:
        warn(f"{name}={raw!r} is not a non-negative number; using {default}")
        return default


@dataclass
class RecorderConfig:
    dump_dir: str
    hang_timeout: float | None  # None or 0: no hang watchdog
    buffer_size: int = DEFAULT_BUFFER
    stacks: bool = True  # dumps include every thread's Python stack
    dump_on_exit: bool = False  # also dump at a clean exit (else only when a collective is still pending)
    frames: int = CALLER_FRAMES  # caller frames kept per call
    suspect_floor: float | None = DEFAULT_SUSPECT_FLOOR  # None or 0: no suspected stage, only the hang timeout
    suspect_factor: float = DEFAULT_SUSPECT_FACTOR
    layout: str = "flat"  # flat, host or auto: where in dump_dir each rank's files go (recorder/layout.py)
    start_timeout: float = DEFAULT_START_TIMEOUT  # 0: start-up is held to the hang timeout like any other wait

    @classmethod
    def resolve(cls, dump_dir=None, hang_timeout=None, buffer_size=None, stacks=None, dump_on_exit=None,
                suspect_floor=None, suspect_factor=None, start_timeout=None):
        """Explicit arguments win over DISTDOCTOR_* environment variables, which win over defaults."""
        if dump_dir is None:
            dump_dir = os.environ.get("DISTDOCTOR_DUMP_DIR") or DEFAULT_DUMP_DIR
        if hang_timeout is None:
            hang_timeout = _env_number("DISTDOCTOR_HANG_TIMEOUT", float, DEFAULT_HANG_TIMEOUT)
        if buffer_size is None:
            buffer_size = _env_number("DISTDOCTOR_BUFFER", int, DEFAULT_BUFFER)
        if stacks is None:
            stacks = os.environ.get("DISTDOCTOR_STACKS", "1") != "0"
        if dump_on_exit is None:
            dump_on_exit = os.environ.get("DISTDOCTOR_DUMP_ON_EXIT", "0") == "1"
        frames = _env_number("DISTDOCTOR_FRAMES", int, CALLER_FRAMES)
        if suspect_floor is None:
            suspect_floor = _env_number("DISTDOCTOR_SUSPECT_FLOOR", float, DEFAULT_SUSPECT_FLOOR)
        if suspect_factor is None:
            suspect_factor = _env_number("DISTDOCTOR_SUSPECT_FACTOR", float, DEFAULT_SUSPECT_FACTOR)
        if start_timeout is None:
            start_timeout = _env_number("DISTDOCTOR_START_TIMEOUT", float, DEFAULT_START_TIMEOUT)
        if suspect_floor < 0 or suspect_factor < 0 or start_timeout < 0:
            raise ValueError("suspect_floor, suspect_factor and start_timeout must be >= 0")
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be at least 1, got {buffer_size}")
        if hang_timeout is not None and hang_timeout < 0:
            raise ValueError(f"hang_timeout must be >= 0 seconds, got {hang_timeout}")
        layout = os.environ.get("DISTDOCTOR_DUMP_LAYOUT", "flat") or "flat"
        if layout not in LAYOUTS:
            warn(f"DISTDOCTOR_DUMP_LAYOUT={layout!r} is not one of {', '.join(LAYOUTS)}; using flat")
            layout = "flat"
        return cls(os.path.abspath(os.fspath(dump_dir)), hang_timeout or None, int(buffer_size), bool(stacks),
                   bool(dump_on_exit), int(frames), float(suspect_floor) or None, float(suspect_factor), layout,
                   float(start_timeout))
