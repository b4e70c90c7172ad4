"""Real runs' dumps kept as fixtures (tests/fixtures/gloo-*: a fuzz/jobs.py program under `distdoctor run --inject`,
its `.injected.json` beside the dumps): `diagnose` of one form of them alone, as the real-job fuzzer scores it."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def truth(fixture: str) -> dict:
    """The fault that fired."""
    return json.loads((FIXTURES / fixture / ".injected.json").read_text())["fired"][0]


def diagnose_form(fixture: str, pattern: str | tuple[str, ...], world_size: int) -> tuple[int, dict]:
    """(exit code, JSON report) of `diagnose --world-size N` on the files `pattern` matches (or any of several
    patterns: a rank's trace beside others' dumps), alone in a folder."""
    patterns = (pattern,) if isinstance(pattern, str) else pattern
    with tempfile.TemporaryDirectory() as d:
        for f in (f for pat in patterns for f in (FIXTURES / fixture).glob(pat)):
            (Path(d) / f.name).write_bytes(f.read_bytes())
        proc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", d, "--world-size", str(world_size),
                               "--format", "json"], capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)
