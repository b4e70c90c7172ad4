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
then one JSON object per entry, then optionally `{"stacks": {thread: [frames]}}`, then optionally
`{"streams": {stream: StreamState}}` (where each stream stands and what it waits on; the simulator writes it). `dumps()`/`loads()` below
are the one implementation of it.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Sequence
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Literal

State = Literal["issued", "started", "completed"]

NATIVE_FORMAT = "distdoctor-trace"
NATIVE_VERSION = 1
# A rank's state served live through torch's worker server (recorder/live.py serves it, diagnose/live.py reads it):
# the handler's name, the job-store keys of the ranks' addresses, and the dump_reason of a trace served live.
LIVE_HANDLER = "distdoctor_state"
LIVE_PREFIX = "distdoctor_live/"
LIVE_REGISTERED = LIVE_PREFIX + "ranks"  # "R," appended by each rank that registered
TORCH_DEBUG_PREFIX = "debug_server/"  # torch.distributed.debug's own keys
LIVE_REASON = "live state"
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


ENTRY_FIELDS = tuple(f.name for f in fields(Entry))
# What the members of a group must agree on for a collective (diagnose/match.py compares these; the streamed load's
# digests sign them, trace/loaders/stream.py). Output dtypes too: a scatter's non-root members pass no input, so
# their dtype is their output's (collectives.names.dtype_signature).
AGREE_ON = ("op", "root", "in_sizes", "in_dtypes", "out_sizes", "out_dtypes")


def numel(sizes: list[list[int]]) -> int:
    """Elements in all the tensors of an entry's `in_sizes` or `out_sizes`."""
    total = 0
    for shape in sizes:
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def entry_column(entries: Sequence[Entry], name: str) -> list:
    """One field of every entry, in order: straight from the compact form (trace/coded.py) when the entries are
    stored that way."""
    column = getattr(entries, "column", None)
    return column(name) if column is not None else [getattr(e, name) for e in entries]


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
    entries: Sequence[Entry] = field(default_factory=list)  # a list, or loaded: trace/coded.py's Entries
    stacks: dict[str, list[Frame]] | None = None  # thread name -> frames, innermost last
    dump_reason: str | None = None
    dump_time: float | None = None
    host: str | None = None
    pid: int | None = None
    # When this view joins several dumps of the rank (loaders/merge.py): their paths and how they were aligned.
    merged: dict | None = None
    hang: dict | None = None  # recorder: the hang episode this dump belongs to (diagnose/hang_status.py reads it)
    exception: dict | None = None  # recorder: the uncaught exception that ended the rank (type, message, ...)
    launch: dict | None = None  # the launcher's log: how it says this rank ended (trace/loaders/launcher_log.py)
    # Facts about every entry, gathered once for the analysis (trace/summary.py); not part of the trace's value.
    summary: object | None = field(default=None, repr=False, compare=False)
    log: RankLog | None = None  # per-thread state read from the rank's text log (trace/loaders/logs.py)
    # Per-stream state at dump time, in the rank's stream order, when the source knows it (the simulator does):
    # the exact wait-for graph over (rank, stream) is built from it (findings/waitfor.py).
    streams: dict[str, StreamState] | None = None
    # recorder: the process groups / DeviceMeshes this rank created, in order (recorder/creations.py; lint reads them)
    group_creations: list[dict] | None = None
    # Flight Recorder's `pg_status` as the dump gives it: the dump's local pg_id -> (last enqueued, last started,
    # last completed) sequence number, None unknown (trace/frontier.py says what they mean and how a pg_id maps to
    # a group). None when the dump has none.
    pg_status: dict[str, tuple[int | None, int | None, int | None]] | None = None
    comm_lib_version: str | None = None  # the dump's `nccl_version` / `comm_lib_version`: its backend speaks NCCL
    # pg_status's pg_id -> group name where the dump says so (the recorder's traces, from NCCL's own entries)
    pg_names: dict[str, str] | None = None
    # group -> the communicator's sequence numbers this trace cannot see (calls issued where its recorder does not
    # look, known from peers that left Flight Recorder's dump: loaders/align_ranks.py): neither present nor absent.
    unseen: dict[str, frozenset[int]] | None = None
    # group -> the last communicator sequence number that alignment classified as seen or unseen: up to it, a
    # call not `unseen` is one this trace's recorder would have shown (beyond it, nothing is known)
    classified: dict[str, int] | None = None

    def column(self, name: str) -> list:
        return entry_column(self.entries, name)

    @property
    def numbered_by_communicator(self) -> bool:
        """A Flight Recorder dump, or a trace merged with one (merge.py): its calls carry the communicator's numbers
        and it holds every call, those issued from C++ too."""
        return self.source.startswith("flight_recorder") or "flight_recorder_only" in (self.merged or {})

    def would_show(self, group: str, seq: int) -> bool:
        """Whether this trace would hold the communicator's call `seq` on `group` had its rank issued it: a Flight
        Recorder dump (or a trace merged with one) holds every call; a recorder-only trace, the calls its alignment
        among the Flight Recorder ranks classified as ones its recorder sees (not `unseen`: issued from C++), up to
        the last call the alignment classified (beyond it, nothing is known)."""
        if self.source != "native" or "flight_recorder_only" in (self.merged or {}):
            return True
        upto = (self.classified or {}).get(group)
        return upto is not None and seq <= upto and seq not in (self.unseen or {}).get(group, ())


@dataclass
class Waiting:
    """What a blocked stream waits on. kind: event | buffer | collective | comm_init | send | recv; name: the
    event, buffer, group, communicator or p2p channel ("0->2", "0->2 tag x"); op: the op it stands in
    (all_reduce, send, ...); seq: the collective's number on its group (1-based); ranks: the ranks whose streams
    could free it (the same rank for an event or buffer, the members not arrived, the p2p peer)."""
    kind: str
    name: str
    op: str = ""
    seq: int | None = None
    ranks: list[int] = field(default_factory=list)


@dataclass
class Site:
    """An op still ahead on a stream that another stream may wait for. kind: record | release | collective |
    send | recv (a comm_init is a collective on its communicator's name); seq: a collective's number on its
    group when it is known (one stream issues on the group), else None; after: the last named compute before
    it on the stream (what the stream must finish first)."""
    kind: str
    name: str
    op_index: int
    op: str
    seq: int | None = None
    after: str | None = None


@dataclass
class StreamState:
    """Where one stream of a rank stands: the op it is at (`op_index`, `op` its label; None/"" when finished),
    what it waits on when blocked, and the ops still ahead on it that could free others."""
    op_index: int | None = None
    op: str = ""
    waiting: Waiting | None = None
    ahead: list[Site] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> StreamState:
        w = raw.get("waiting")
        return cls(op_index=raw.get("op_index"), op=str(raw.get("op") or ""),
                   waiting=None if w is None else Waiting(**w), ahead=[Site(**a) for a in raw.get("ahead") or []])


@dataclass(slots=True)
class ThreadState:
    """Where one thread (or stream) of a rank stands in its log, from the begin/end markers around its ops."""
    open_op: str | None = None  # the op it began and did not finish (the latest begun when several are open)
    line: str | None = None  # "file:line" of open_op's begin
    run: int = 0  # which run of open_op on this rank it is (1 = its first begin)
    open_for_s: float | None = None  # from open_op's begin to the log's last timestamped line
    last_done: str | None = None  # the last op it finished
    last_done_line: str | None = None
    done: int = 0  # ops it finished
    also_open: list[tuple[str, str]] = field(default_factory=list)  # other unfinished ops (op, file:line), oldest first
    unclosed: int = 0  # begins whose end never came and that a later begin of the same op superseded
    unmatched_ends: int = 0  # ends without a begin (the log starts inside an op, or the begin line was unreadable)


@dataclass
class RankLog:
    """What a rank's text log says beyond collectives: each thread's position and how far each op got."""
    path: str
    lines: int = 0
    skipped: int = 0  # lines that looked like markers or NCCL calls but could not be read
    skipped_at: list[str] = field(default_factory=list)  # "file:line" of the first few
    threads: dict[str, ThreadState] = field(default_factory=dict)
    ops: dict[str, tuple[int, int, str]] = field(default_factory=dict)  # op -> (runs begun, runs finished, thread)
    nccl_last: dict[str, dict] = field(default_factory=dict)  # communicator -> its last call logged on this rank


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
    streamed: bool = False  # loaded streaming: traces hold only what the analysis reads (loaders/stream.py)
    stream_note: str = ""  # why a streaming load fell back to the whole set
    # per rank, its first retirement read back as in flight, a member's final trace refuting it
    # (loaders/completion.py): {rank, group, seq, never_issued_by}
    refuted: list[dict] = field(default_factory=list)
    launch: object | None = None  # the launcher's account of how ranks ended (launcher_log.LaunchLog), when given


MAX_COUNTER = (1 << 63) - 1  # sequence numbers and world sizes are int64 in torch: anything larger is damage
MAX_WORLD = 1 << 24


def trace_problem(trace: RankTrace) -> str | None:
    """What makes a loaded trace impossible (a header's world size or rank, a sequence number out of range),
    in one line, or None. Every reader's result goes through it before an analysis trusts the numbers."""
    ws = trace.world_size
    if ws is not None and (isinstance(ws, bool) or not isinstance(ws, int) or not 1 <= ws <= MAX_WORLD):
        return f"header world_size {ws!r} is not a number of ranks (1 to {MAX_WORLD})"
    if isinstance(trace.rank, bool) or not isinstance(trace.rank, int) or not 0 <= trace.rank < MAX_WORLD:
        return f"header rank {trace.rank!r} is not a rank (0 to {MAX_WORLD - 1})"
    for name in ("seq", "p2p_seq"):
        bounds = _known_bounds(trace, name)
        if bounds == () or (bounds is not None and 0 <= bounds[0] and bounds[1] <= MAX_COUNTER):
            continue
        column = trace.column(name)
        i, value = next(((i, v) for i, v in enumerate(column) if v is not None and (
            isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNTER)), (None, None))
        if i is None:
            continue
        shown = value if not isinstance(value, int) or abs(value) < 10**20 else f"{str(value)[:12]}..."
        return f"entry {i}: {name} {shown!r} is not a sequence number (0 to 2^63-1)"
    return None


def _known_bounds(trace: RankTrace, name: str) -> tuple | None:
    """(lowest, highest) of a field's known values, () when none is known, None when they do not compare. From
    the entries' own arrays where they hold them (trace/coded.py; a streamed trace's held entries, whose trimmed
    ones passed this check whole where the trace was read: loaders/stream.py)."""
    arrays = getattr(trace.entries, "known_bounds", None)
    got = arrays(name) if arrays is not None else None
    if got is not None:
        return got
    values = list(filter(functools.partial(operator.is_not, None), trace.column(name)))  # at C speed
    try:
        return (min(values), max(values)) if values else ()
    except TypeError:
        return None


# ---- native format -------------------------------------------------------------------------------------------

def _frames_from(raw: list) -> list[Frame]:
    return [Frame(str(f["name"]), str(f["filename"]), int(f["line"])) for f in raw]


def dumps(trace: RankTrace) -> str:
    """Serialize one rank's trace in the native JSON-lines format."""
    lines = [json.dumps(_header_of(trace))]
    lines.extend(json.dumps(asdict(e)) for e in trace.entries)
    if trace.stacks is not None:
        lines.append(json.dumps({"stacks": {t: [asdict(f) for f in fr] for t, fr in trace.stacks.items()}}))
    if trace.streams is not None:
        lines.append(json.dumps({"streams": {s: st.to_json() for s, st in trace.streams.items()}}))
    return "\n".join(lines) + "\n"


def _header_of(trace: RankTrace) -> dict:
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
    header.update({k: v for k, v in (("hang", trace.hang), ("exception", trace.exception),
                                     ("group_creations", trace.group_creations), ("pg_status", trace.pg_status),
                                     ("pg_names", trace.pg_names), ("comm_lib_version", trace.comm_lib_version))
                   if v is not None})
    return header


def _pg_status(raw) -> dict[str, tuple[int | None, int | None, int | None]] | None:
    """A native header's pg_status (pg_id -> [enqueued, started, completed]); None when absent or not that shape."""
    if not isinstance(raw, dict):
        return None
    out = {}
    for k, v in raw.items():
        if not isinstance(v, list) or len(v) != 3 or not all(x is None or type(x) is int for x in v):
            return None
        out[str(k)] = tuple(v)
    return out


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
    _check_header(header)
    lineno = 1
    try:
        trace = _header_trace(header, path)
        for lineno, line in enumerate(lines[1:], start=2):
            obj = json.loads(line)
            if "stacks" in obj and "op" not in obj:
                trace.stacks = {str(t): _frames_from(fr) for t, fr in obj["stacks"].items()}
                continue
            if "streams" in obj and "op" not in obj:
                trace.streams = {str(s): StreamState.from_json(st) for s, st in obj["streams"].items()}
                continue
            obj["frames"] = _frames_from(obj.get("frames") or [])
            trace.entries.append(Entry(**obj))
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {lineno} is not JSON ({exc.msg}); the file may be truncated") from None
    except RecursionError:
        raise ValueError(f"line {lineno} is nested too deeply to be a distdoctor trace") from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        # Any wrong type or missing field in an untrusted file is the file's fault: one line, no traceback.
        why = str(exc).replace("\n", "\\n")  # one line, whatever a damaged field name holds
        raise ValueError(f"malformed distdoctor trace ({type(exc).__name__}: {why})") from None
    return trace


def _check_header(header) -> None:
    if not isinstance(header, dict) or header.get("format") != NATIVE_FORMAT:
        raise ValueError("not a distdoctor trace (no distdoctor-trace header)")
    if header.get("version") != NATIVE_VERSION:
        raise ValueError(f"unsupported distdoctor-trace version {header.get('version')!r}")


def _header_trace(header: dict, path: str) -> RankTrace:
    """The RankTrace a native header describes (no entries yet)."""
    return RankTrace(
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
        hang=header.get("hang") if isinstance(header.get("hang"), dict) else None,
        exception=header.get("exception") if isinstance(header.get("exception"), dict) else None,
        group_creations=[c for c in header["group_creations"] if isinstance(c, dict)] or None
        if isinstance(header.get("group_creations"), list) else None,
        pg_status=_pg_status(header.get("pg_status")),
        pg_names={str(k): str(v) for k, v in header["pg_names"].items()}
        if isinstance(header.get("pg_names"), dict) else None,
        comm_lib_version=str(header["comm_lib_version"]) if header.get("comm_lib_version") else None,
    )


# ---- the native trace as one object (a live answer's `trace_object`) -------------------------------------------

_ENTRY_DEFAULTS = {f.name: f.default if f.default_factory is MISSING else f.default_factory()
                   for f in fields(Entry) if f.name not in ("index", "group", "op")}


def to_object(trace: RankTrace) -> dict:
    """The native format as one JSON-ready object: the header's fields, then `frames` (each distinct frame once, as
    [name, filename, line]), `entries` (each with only the fields that differ from Entry's defaults, its frames
    as indices into `frames`) and `stacks` (thread -> frame indices). What a live answer carries: a JSON
    decoder gives the reader the entries' fields directly, with no text inside the text to decode again."""
    table: dict[tuple, int] = {}

    def refs(frames: list[Frame]) -> list[int]:
        return [table.setdefault((f.name, f.filename, f.line), len(table)) for f in frames]

    out = _header_of(trace)
    entries = []
    for e in trace.entries:
        row = {"index": e.index, "group": e.group, "op": e.op}
        for name, default in _ENTRY_DEFAULTS.items():
            value = getattr(e, name)
            if value != default:
                row[name] = refs(value) if name == "frames" else value
        entries.append(row)
    out["entries"] = entries
    if trace.stacks is not None:
        out["stacks"] = {t: refs(frames) for t, frames in trace.stacks.items()}
    if trace.streams is not None:
        out["streams"] = {s: st.to_json() for s, st in trace.streams.items()}
    out["frames"] = [list(k) for k in table]
    return out


def from_object(obj, path: str = "") -> RankTrace:
    """`to_object`'s form read back (from untrusted JSON): ValueError with a reason when it is not one."""
    _check_header(obj)
    try:
        table = [Frame(str(name), str(filename), int(line)) for name, filename, line in obj.get("frames") or []]
        shared: dict[tuple, list[Frame]] = {}  # entries called from one place share one list of frames

        def frames_of(refs) -> list[Frame]:
            key = tuple(refs)
            got = shared.get(key)
            if got is None:
                if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(table) for i in key):
                    raise ValueError(f"frame references {list(key)[:8]!r} are not indices into its frames")
                got = shared[key] = [table[i] for i in key]
            return got

        trace = _header_trace(obj, path)
        entries = []
        for row in obj.get("entries") or []:
            row = dict(row)
            if "frames" in row:
                row["frames"] = frames_of(row["frames"])
            entries.append(Entry(**row))
        trace.entries = entries
        if obj.get("stacks") is not None:
            trace.stacks = {str(t): list(frames_of(refs)) for t, refs in obj["stacks"].items()}
        if obj.get("streams") is not None:
            trace.streams = {str(s): StreamState.from_json(st) for s, st in obj["streams"].items()}
    except RecursionError:
        raise ValueError("nested too deeply to be a distdoctor trace") from None
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        why = str(exc).replace("\n", "\\n")
        raise ValueError(f"malformed distdoctor trace ({type(exc).__name__}: {why})") from None
    return trace
