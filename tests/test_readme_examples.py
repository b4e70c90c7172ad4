"""The README's shown outputs are the tool's real output: every `$ distdoctor ...` line in a README code block is
run and the lines shown under it must appear in what it prints, in order (a `...` line stands for lines left
out). Deterministic commands (sim) are compared line for line; commands that time a real world (check) compare
their stable lines with every decimal number masked, and are slow; `env` describes the machine it runs on, so
only its fields are compared. A README example whose command is not covered here fails the test."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SRC = str(ROOT / "src")

# How each example is compared: "exact" lines, "masked" (decimal numbers masked), "fields" (first word of each
# line), with the commands that run a world marked slow.
MODES = {"distdoctor sim ": ("exact", False), "distdoctor check --inject": ("masked", True),
         "distdoctor check": ("masked", True), "distdoctor env": ("fields", False)}


def examples() -> list[tuple[str, list[str]]]:
    """(command, shown lines) for every `$ ` line of the README's code blocks."""
    found, block, current = [], False, None
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            block, current = not block, None
            continue
        if not block:
            continue
        if line.startswith("$ "):
            command = re.sub(r"\s+#.*$", "", line[2:]).strip()  # a trailing comment is the README's, not the tool's
            current = (command, [])
            found.append(current)
        elif current is not None:
            current[1].append(line)
    return found


def _mode(command: str) -> tuple[str, bool]:
    return next((m for prefix, m in MODES.items() if command.startswith(prefix)), ("unknown", False))


EXAMPLES = examples()
PARAMS = [pytest.param(c, shown, marks=[pytest.mark.slow] if _mode(c)[1] else [], id=c) for c, shown in EXAMPLES]


def _mask(line: str) -> str:
    return re.sub(r"\d+\.\d+", "#", line).rstrip()


def _in_order(shown: list[str], got: list[str], key) -> None:
    """Every shown line (but `...`) is among the printed lines, in order."""
    want = [key(s) for s in shown if s.strip() and s.strip() != "..."]
    have = [key(g) for g in got]
    pos = 0
    for line in want:
        assert line in have[pos:], f"README line not printed (in this order):\n{line}\n--- printed:\n" + \
            "\n".join(have)
        pos = have.index(line, pos) + 1


def test_the_readme_shows_examples():
    assert len(EXAMPLES) >= 6 and all(c.startswith("distdoctor ") for c, _ in EXAMPLES), EXAMPLES


@pytest.mark.parametrize("command, shown", PARAMS)
def test_readme_example_prints_what_the_readme_shows(command, shown, tmp_path):
    mode, _ = _mode(command)
    assert mode != "unknown", f"say in MODES how to compare the README's `{command}`"
    argv = shlex.split(command)[1:]
    out = subprocess.run([sys.executable, "-m", "distdoctor", *argv], capture_output=True, text=True, timeout=600,
                         cwd=tmp_path, env=dict(os.environ, PYTHONPATH=SRC, COLUMNS="200"))
    assert out.returncode in (0, 1), out.stderr[-2000:]
    got = out.stdout.splitlines()
    if mode == "exact":
        _in_order(shown, got, lambda ln: ln.rstrip())
    elif mode == "masked":
        _in_order(shown, got, _mask)
    else:
        assert [ln.split()[0] for ln in shown if ln.strip()] == [ln.split()[0] for ln in got if ln.strip()], out.stdout
