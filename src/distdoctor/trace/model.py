"""THE normalized trace model. Loaders and the recorder produce it; the analyzer and reports only read it.

One `RankTrace` per rank: its process groups (with members, given or inferred), its ordered collective and
p2p entries, and optionally the Python stacks of its threads at dump time. A `TraceSet` is what `diagnose`
works on: the ranks that loaded, plus a clear error for every file that did not.

Conventions every producer follows:
- `op` is a collective spec name (distdoctor.collectives: "all_reduce", "all_gather", ...) or "send"/"recv";
  anything else keeps its raw name prefixed "other:".
- `group` is the group's name as the dump gives it in entries; the default (world) group is "0".
- `seq` is the per-group collective sequence number (the n-th collective issued on that group), starting at
  whatever the source starts at; p2p entries carry `p2p_seq` instead (per group, per direction as recorded).
- ranks (members, root, peer) are global ranks.
- times are seconds since the epoch (float), None when unknown.

The native file format (what the recorder writes, `.jsonl`): line 1 is the header
`{"format": "distdoctor-trace", "version": 1, "rank", "world_size", "groups", "dump_reason", "dump_time", ...}`,
then one JSON object per entry, then optionally `{"stacks": {thread: [frames]}}`. `dumps()`/`loads()` below
are the one implementation of it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

State = Literal["issued", "started", "completed"]

NATIVE_FORMAT = "distdoctor-trace"
NATIVE_VERSION = 1
DEFAULT_GROUP = "0"


@dataclass(slots=True)  # slots: a big trace set holds millions of entries (smaller, faster to build)
class Frame:
    name: str
    filename: str
    line: int

    def __str__(self) -> str:
        return f"{self.name} ({self.filename}:{self.line})"


@dataclass(slots=True)
class Entry:
    index: int  # position in this rank's trace (the source's record id when it has one)
    group: str
    op: str
    seq: int | None = None
    p2p_seq: int | None = None
    raw_op: str = ""
    in_sizes: list[list[int]] = field(default_factory=list)
    out_sizes: list[list[int]] = field(default_factory=list)
    in_dtypes: list[str] = field(default_factory=list)
    out_dtypes: list[str] = field(default_factory=list)
    root: int | None = None  # broadcast/reduce/gather/scatter src or dst, global rank
    peer: int | None = None  # send/recv peer, global rank
    reduce_op: str | None = None
    state: State = "issued"
    t_created: float | None = None
    t_started: float | None = None
    t_completed: float | None = None
    async_op: bool | None = None
    stream: str | None = None  # stream or thread the call was made on
    frames: list[Frame] = field(default_factory=list)
    error: str | None = None  # the call raised (recorder): "ExceptionType: message"

    @property
    def is_p2p(self) -> bool:
        return self.op in ("send", "recv")


@dataclass
class GroupInfo:
    name: str
    ranks: list[int]
    inferred: bool = False  # membership inferred from which ranks issued on it, not given by the dump
    desc: str = ""


@dataclass
class RankTrace:
    rank: int
    source: str  # "flight_recorder-pickle" | "flight_recorder-json" | "native" | "simulated"
    path: str = ""
    version: str = ""
    world_size: int | None = None
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    entries: list[Entry] = field(default_factory=list)
    stacks: dict[str, list[Frame]] | None = None  # thread name -> frames, innermost last
    dump_reason: str | None = None
    dump_time: float | None = None
    host: str | None = None
    pid: int | None = None


@dataclass
class LoadError:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class TraceSet:
    ranks: dict[int, RankTrace] = field(default_factory=dict)
    errors: list[LoadError] = field(default_factory=list)
    world_size: int | None = None


# ---- native format -------------------------------------------------------------------------------------------

def _frames_from(raw: list) -> list[Frame]:
    return [Frame(str(f["name"]), str(f["filename"]), int(f["line"])) for f in raw]


def dumps(trace: RankTrace) -> str:
    """Serialize one rank's trace in the native JSON-lines format."""
    header = {
        "format": NATIVE_FORMAT,
        "version": NATIVE_VERSION,
        "rank": trace.rank,
        "world_size": trace.world_size,
        "source": trace.source,
        "groups": {name: asdict(g) for name, g in trace.groups.items()},
        "dump_reason": trace.dump_reason,
        "dump_time": trace.dump_time,
        "host": trace.host,
        "pid": trace.pid,
    }
    lines = [json.dumps(header)]
    lines.extend(json.dumps(asdict(e)) for e in trace.entries)
    if trace.stacks is not None:
        lines.append(json.dumps({"stacks": {t: [asdict(f) for f in fr] for t, fr in trace.stacks.items()}}))
    return "\n".join(lines) + "\n"


def loads(text: str, path: str = "") -> RankTrace:
    """Parse the native format. Raises ValueError with a reason (the loader adds the file name)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise ValueError("empty file")
    try:
        header = json.loads(lines[0])
    except json.JSONDecodeError as exc:
        raise ValueError(f"line 1 is not JSON ({exc.msg})") from None
    except RecursionError:
        raise ValueError("line 1 is nested too deeply to be a distdoctor trace") from None
    if not isinstance(header, dict) or header.get("format") != NATIVE_FORMAT:
        raise ValueError("not a distdoctor trace (no distdoctor-trace header)")
    if header.get("version") != NATIVE_VERSION:
        raise ValueError(f"unsupported distdoctor-trace version {header.get('version')!r}")
    lineno = 1
    try:
        trace = RankTrace(
            rank=int(header["rank"]),
            source=str(header.get("source") or "native"),
            path=path,
            version=str(header["version"]),
            world_size=header.get("world_size"),
            groups={str(n): GroupInfo(**g) for n, g in (header.get("groups") or {}).items()},
            dump_reason=header.get("dump_reason"),
            dump_time=header.get("dump_time"),
            host=header.get("host"),
            pid=header.get("pid"),
        )
        for lineno, line in enumerate(lines[1:], start=2):
            obj = json.loads(line)
            if "stacks" in obj and "op" not in obj:
                trace.stacks = {str(t): _frames_from(fr) for t, fr in obj["stacks"].items()}
                continue
            obj["frames"] = _frames_from(obj.get("frames") or [])
            trace.entries.append(Entry(**obj))
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {lineno} is not JSON ({exc.msg}); the file may be truncated") from None
    except RecursionError:
        raise ValueError(f"line {lineno} is nested too deeply to be a distdoctor trace") from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        # Any wrong type or missing field in an untrusted file is the file's fault: one line, no traceback.
        raise ValueError(f"malformed distdoctor trace ({type(exc).__name__}: {exc})") from None
    return trace
