"""Live processes from /proc, for the tests that check no process is left behind."""

from __future__ import annotations

import os

# Field positions in /proc/<pid>/stat after the command name: state, ppid, pgrp, session.
STATE, PPID, PGRP, SESSION = 0, 1, 2, 4


def live_processes(field: int, value: int) -> list[int]:
    """Pids of live (non-zombie) processes whose stat `field` (PPID, PGRP, SESSION) equals `value`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[field]) == value and fields[STATE] not in ("Z", "X"):
            found.append(int(entry))
    return found
