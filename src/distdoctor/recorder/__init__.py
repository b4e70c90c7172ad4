"""The recorder: every torch.distributed call of a rank in a ring buffer, dumped when the job hangs or dies.

API (importing this package does not import torch):

    import distdoctor.recorder
    distdoctor.recorder.enable(dump_dir="dumps", hang_timeout=300)   # before or after init_process_group
    ...
    distdoctor.recorder.dump("after step 10")                        # on demand; also on hang/SIGUSR1/exception

Environment (what `distdoctor run` sets): DISTDOCTOR_TRACE=1 enables it through the sitecustomize hook;
DISTDOCTOR_DUMP_DIR, DISTDOCTOR_HANG_TIMEOUT (seconds, 0 = off), DISTDOCTOR_SUSPECT_FLOOR and
DISTDOCTOR_SUSPECT_FACTOR (a hang is suspected after max(floor, factor x the longest recent collective wait)),
DISTDOCTOR_BUFFER (entries per rank),
DISTDOCTOR_STACKS=0 (no thread stacks in dumps), DISTDOCTOR_DUMP_ON_EXIT=1 (dump at every exit).

ring (the buffer and the public API), patch and describe (the wrappers around torch.distributed), dumpfile (the
files), watchdog and hangwatch (when to dump), run_watch and command (`distdoctor run`), hook (sitecustomize).
It writes the trace model of distdoctor.trace.
"""

from __future__ import annotations

from distdoctor.recorder.ring import RecorderConfig, disable, dump, enable, get_recorder


def enable_from_env() -> None:
    """Enable when DISTDOCTOR_TRACE is set to a true value (what the sitecustomize hook calls)."""
    import os

    if os.environ.get("DISTDOCTOR_TRACE", "").strip().lower() in ("1", "true", "yes", "on"):
        enable()


__all__ = ["enable", "disable", "dump", "enable_from_env", "get_recorder", "RecorderConfig"]
