"""distdoctor's own trace files (recorder and simulator output): the JSON-lines format of trace/model.py."""

from __future__ import annotations

from distdoctor.trace.model import NATIVE_FORMAT, RankTrace, loads


def is_native(first_line: bytes) -> bool:
    return first_line.lstrip().startswith(b"{") and NATIVE_FORMAT.encode() in first_line


def load_native(data: bytes, path: str) -> RankTrace:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    trace = loads(text, path=path)
    # Frames default to fresh lists in the model; entries without frames share one to keep big traces small.
    return trace
