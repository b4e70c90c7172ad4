"""Every Markdown file in the repository renders: balanced code fences, nothing pasted twice.

Merges and hand edits have left half-copied sections behind (a lost fence turns the rest of a page into code);
these checks catch that class, not one instance: fences pair up, no prose paragraph or heading appears twice
in a file, and no line of example output appears twice inside one code block.
"""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^\s*(```|~~~)")


def markdown_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "*.md", "**/*.md"], cwd=ROOT, capture_output=True, text=True,
                             timeout=30, check=True).stdout.split()
        files = sorted({ROOT / p for p in out})
    except (OSError, subprocess.SubprocessError):  # not a git checkout (an unpacked sdist): walk the tree
        files = sorted(p for p in ROOT.rglob("*.md") if ".git" not in p.parts)
    return [p for p in files if p.is_file()]


def split_blocks(text: str) -> tuple[list[str], list[list[str]], int]:
    """(prose paragraphs, code blocks as line lists, number of fence lines)."""
    paragraphs, blocks, fences = [], [], 0
    para: list[str] = []
    code: list[str] | None = None
    for line in text.splitlines():
        if FENCE.match(line):
            fences += 1
            if code is None:
                if para:
                    paragraphs.append(" ".join(para))
                    para = []
                code = []
            else:
                blocks.append(code)
                code = None
            continue
        if code is not None:
            code.append(line)
        elif line.strip():
            para.append(line.strip())
        elif para:
            paragraphs.append(" ".join(para))
            para = []
    if para:
        paragraphs.append(" ".join(para))
    return paragraphs, blocks, fences


FILES = markdown_files()


def test_there_are_markdown_files_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in FILES}
    assert "README.md" in names and "docs/diagnose.md" in names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_markdown_renders_and_repeats_nothing(path):
    paragraphs, blocks, fences = split_blocks(path.read_text(encoding="utf-8"))
    assert fences % 2 == 0, f"{path.name}: {fences} code fences, one is unbalanced"

    seen: set[str] = set()
    for p in paragraphs:
        key = re.sub(r"\s+", " ", p)
        if len(key) < 60 or key.startswith("|"):  # short lines and table rows may legitimately recur
            continue
        assert key not in seen, f"{path.name}: paragraph appears twice: {key[:120]!r}"
        seen.add(key)

    headings = [p for p in paragraphs if p.startswith("#")]
    dup = {h for h in headings if headings.count(h) > 1}
    assert not dup, f"{path.name}: heading appears twice: {sorted(dup)}"

    for block in blocks:
        for output in command_outputs(block):
            lines = [ln.rstrip() for ln in output if len(ln.strip()) >= 30]
            dup_lines = {ln for ln in lines if lines.count(ln) > 1}
            assert not dup_lines, f"{path.name}: a command's output repeats {sorted(dup_lines)[0].strip()!r}"


def command_outputs(block: list[str]) -> list[list[str]]:
    """A code block cut at its `$ command` lines: one command's output may not repeat a line, two may."""
    outputs: list[list[str]] = [[]]
    for line in block:
        if line.lstrip().startswith("$ "):
            outputs.append([])
        else:
            outputs[-1].append(line)
    return outputs


def test_the_checks_catch_what_they_are_for():
    """The checker itself can fail: an odd fence, a pasted paragraph, a repeated output line."""
    para = "A paragraph long enough to count as prose, written once and then pasted a second time."
    assert split_blocks("```\ncode\n")[2] % 2 == 1
    paragraphs, _, _ = split_blocks(f"{para}\n\n{para}\n")
    assert paragraphs.count(para) == 2
    line = "  rank 4 bwd at op 3 (send to 0 (grad_mb0))"
    _, blocks, _ = split_blocks(f"```\n$ sim a\n{line}\n{line}\n$ sim b\n{line}\n```\n")
    assert [len(o) for o in command_outputs(blocks[0])] == [0, 2, 1]
