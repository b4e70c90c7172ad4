"""Per-rank traces of collective calls: the normalized model (model.py) and the loaders that read every form a
job leaves (loaders/); summary.py and coded.py are the model's compact views for the analyses.

The recorder that writes these traces is distdoctor.recorder. `distdoctor.trace.enable()`, `dump()`,
`disable()`, `get_recorder()` and `RecorderConfig` still resolve to it (loaded on first use), for code written
before the recorder had a package of its own.
"""

from __future__ import annotations

_MOVED_TO_RECORDER = ("enable", "disable", "dump", "enable_from_env", "get_recorder", "RecorderConfig")


def __getattr__(name: str):
    if name in _MOVED_TO_RECORDER:
        import distdoctor.recorder

        return getattr(distdoctor.recorder, name)
    raise AttributeError(f"module 'distdoctor.trace' has no attribute {name!r}")
