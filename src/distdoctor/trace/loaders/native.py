"""distdoctor's own trace files (recorder and simulator output): the JSON-lines format of trace/model.py.

model.loads parses; this module also checks the types the analyzer relies on, so a hand-edited or damaged
trace gives a LoadError naming the line instead of failing later inside the analysis.
"""

from __future__ import annotations

from distdoctor.collectives import canonical_dtype
from distdoctor.trace.model import NATIVE_FORMAT, RankTrace, from_object, loads, trace_problem

_STATES = ("issued", "started", "completed")


def is_native(first_line: bytes) -> bool:
    return first_line.lstrip().startswith(b"{") and NATIVE_FORMAT.encode() in first_line


def _int_or_none(v) -> bool:
    """None, or an integer within int64 (the compact form's arrays, trace/coded.py, hold them)."""
    return v is None or (isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63))


def _sizes_ok(v) -> bool:
    return isinstance(v, list) and all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in v)


def _check(trace: RankTrace) -> None:
    if not isinstance(trace.world_size, (int, type(None))) or isinstance(trace.world_size, bool):
        raise ValueError(f"header world_size is {trace.world_size!r}, not a number")
    if trace.dump_time is not None and (not isinstance(trace.dump_time, (int, float)) or isinstance(trace.dump_time, bool)):
        raise ValueError(f"header dump_time is {trace.dump_time!r}, not a time")
    for name in ("dump_reason", "host"):
        if not isinstance(getattr(trace, name), (str, type(None))):
            raise ValueError(f"header {name} is {getattr(trace, name)!r}, not text")
    for name, g in trace.groups.items():
        if not isinstance(g.ranks, list) or not all(_int_or_none(r) and r is not None for r in g.ranks):
            raise ValueError(f"group {name!r} has ranks {g.ranks!r}, not a list of ranks")
    for i, e in enumerate(trace.entries):
        where = f"entry {i} (line {i + 2})"
        if not isinstance(e.group, str) or not isinstance(e.op, str):
            raise ValueError(f"{where}: group and op must be strings")
        if e.state not in _STATES:
            raise ValueError(f"{where}: state {e.state!r} is not one of {', '.join(_STATES)}")
        for name in ("index", "seq", "p2p_seq", "root", "peer"):
            v = getattr(e, name)
            if not _int_or_none(v) or (name == "index" and v is None):
                what = "is beyond a 64-bit integer" if isinstance(v, int) and not isinstance(v, bool) else \
                    "is not an integer"
                raise ValueError(f"{where}: {name} {v!r} {what}")
        for name in ("in_sizes", "out_sizes"):
            if not _sizes_ok(getattr(e, name)):
                raise ValueError(f"{where}: {name} must be a list of shapes (lists of integers)")
        for name in ("in_dtypes", "out_dtypes"):
            v = getattr(e, name)
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise ValueError(f"{where}: {name} must be a list of dtype names")
        for name in ("stream", "raw_op", "reduce_op"):
            if not isinstance(getattr(e, name), (str, type(None))):
                raise ValueError(f"{where}: {name} {getattr(e, name)!r} is not text")
        for name in ("t_created", "t_started", "t_completed"):
            v = getattr(e, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise ValueError(f"{where}: {name} {v!r} is not a time")


def load_native(data: bytes, path: str) -> RankTrace:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text (byte {exc.start})") from None
    return _checked(lambda: loads(text, path=path))


def load_native_object(obj, path: str) -> RankTrace:
    """A native trace in its one-object form (model.to_object: what a rank's live answer carries, already
    decoded by the JSON reader), checked as a file is."""
    return _checked(lambda: from_object(obj, path=path))


def _checked(read) -> RankTrace:
    try:
        trace = read()
        _check(trace)  # the types first: its messages name the line
        problem = trace_problem(trace)
        if problem:
            raise ValueError(f"malformed distdoctor trace ({problem})")
        _canonical_dtypes(trace)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except (AttributeError, TypeError, KeyError, IndexError) as exc:  # a field of the wrong kind
        raise ValueError(f"malformed distdoctor trace ({type(exc).__name__}: {exc})") from None
    return trace


def _canonical_dtypes(trace: RankTrace) -> None:
    """One dtype vocabulary with the Flight Recorder loaders ("float32", never "Float"); equal lists shared."""
    shared: dict[tuple, list[str]] = {}
    for e in trace.entries:
        for name in ("in_dtypes", "out_dtypes"):
            value = getattr(e, name)
            if value:
                key = tuple(value)
                got = shared.get(key)
                if got is None:
                    got = shared[key] = [canonical_dtype(d) for d in value]
                setattr(e, name, got)
