"""The recorder's call sites reach the user's code even when a library calls in from deep inside torch (FSDP's
all_gathers, the pipeline schedules' sends): patch.caller_frames keeps the caller's innermost frames outside
torch, and only the innermost two of torch's own."""

from __future__ import annotations

import sys

from distdoctor.recorder import patch

TORCH_FILE = "/venv/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py"
LIBRARY = "\n".join(f"def lib{i}(k):\n    return lib{i + 1}(k)" for i in range(8)) + \
    "\ndef lib8(k):\n    return k(sys._getframe(0))\n"


def _library_calls(k):
    """Eight nested frames whose code lives in a torch file, the innermost calling k(its own frame)."""
    scope = {"sys": sys}
    exec(compile(LIBRARY, TORCH_FILE, "exec"), scope)
    return scope["lib0"](k)


def user_step():
    return _library_calls(lambda frame: patch.caller_frames(frame, 4))


def test_the_callers_frames_outside_torch_are_kept():
    frames = [(code.co_name, code.co_filename) for code, _ in user_step()]
    assert [name for name, _ in frames[:2]] == ["lib8", "lib7"]  # torch's innermost two: which API called in
    assert all(filename == TORCH_FILE for _, filename in frames[:2])
    outside = frames[2:]
    assert len(outside) == 4 and all(filename != TORCH_FILE for _, filename in outside)
    assert [name for name, _ in outside[:2]] == ["_library_calls", "user_step"]


def test_no_frames_when_none_are_wanted():
    assert _library_calls(lambda frame: patch.caller_frames(frame, 0)) == []
