"""Every Flight Recorder entry field distdoctor reads, once: its name, the dump versions known to have it, its role
and its conversion to the trace model. The readers derive from this table and from nothing else:
- the C readers' name tables (fr_json_scan, fr_pickle_scan pass `kernel_names(...)` to the kernels);
- the Python reader (fr_reader.py): which fields are keyed into rows, which are per-entry integers;
- what an entry means (`interpret`: `retired` = completed, group '' = '0', the p2p peer, dtype names);
- the validator (fr_reader.read_entries): a damaged entry is named by its index and the field.

Roles: ROW fields repeat (a dump holds a handful of distinct combinations of them: each is interpreted once),
INT fields are the integers each entry has of its own (int64; `None`/absent: unknown), FRAMES is the stack.
A new integer field is one row here (and, for the model to keep it, one Entry field); the C readers take their
name tables from this module, so they read it without a change.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from distdoctor.collectives import canonical_dtype, canonical_op
from distdoctor.trace.coded import Row
from distdoctor.trace.model import DEFAULT_GROUP, Frame

ROW, INT, FRAMES = "row", "int", "frames"


@dataclass(frozen=True)
class FrField:
    name: str  # the key in an entry
    since: str  # the first dump version known to have it (2.4: the NCCL fixtures; 2.10: torch 2.13)
    role: str  # ROW, INT or FRAMES
    model: str  # the Entry field it fills (ROW fields: see interpret)
    seconds: bool = False  # INT: nanoseconds, kept as seconds (0 also unknown)
    only: str | None = None  # INT: kept only on "collective" or only on "p2p" entries (None on the others)
    required: bool = False  # ROW: absent refused; INT: None refused, absent the entry's position (record_id)


FIELDS = (
    FrField("record_id", "2.0", INT, "index", required=True),
    FrField("collective_seq_id", "2.0", INT, "seq", only="collective"),
    FrField("p2p_seq_id", "2.0", INT, "p2p_seq", only="p2p"),
    FrField("time_created_ns", "2.0", INT, "t_created", seconds=True),
    FrField("time_discovered_started_ns", "2.0", INT, "t_started", seconds=True),
    FrField("time_discovered_completed_ns", "2.0", INT, "t_completed", seconds=True),
    FrField("process_group", "2.0", ROW, "group", required=True),  # (name, desc); Gloo's default group: ''
    FrField("profiling_name", "2.0", ROW, "op", required=True),  # "nccl:send 0->1": raw_op and the p2p peer too
    FrField("input_sizes", "2.0", ROW, "in_sizes"),
    FrField("output_sizes", "2.0", ROW, "out_sizes"),
    FrField("input_dtypes", "2.4", ROW, "in_dtypes"),
    FrField("output_dtypes", "2.4", ROW, "out_dtypes"),
    FrField("state", "2.0", ROW, "state"),  # scheduled / started / completed
    FrField("retired", "2.0", ROW, "state"),  # completed, whatever `state` says (Gloo entries stay scheduled)
    FrField("thread_name", "2.10", ROW, "stream"),
    FrField("is_p2p", "2.4", ROW, "p2p_seq"),  # the entry's seq is the p2p one
    FrField("frames", "2.0", FRAMES, "frames"),
)
ROW_FIELDS = tuple(f.name for f in FIELDS if f.role == ROW)
INT_FIELDS = tuple(f for f in FIELDS if f.role == INT)
BY_NAME = {f.name: f for f in FIELDS}


def kernel_names(layout: str) -> tuple[str, ...]:
    """The field names in the order a C reader numbers them: "json" (_fr_json_kernel.c: the integers it parses
    first, then the fields it spans) or "pickle" (_fr_pickle_kernel.c: the row fields, the stack, the integers)."""
    ints = tuple(f.name for f in INT_FIELDS)
    if layout == "json":
        return (*ints, *ROW_FIELDS, "frames")
    return (*ROW_FIELDS, "frames", *ints)


_STATES = {"completed": "completed", "started": "started", "scheduled": "issued"}
_P2P_META = re.compile(r"^\s*(\d+)\s*(->|<-)\s*(\d+)\s*$")


def interpret(raw: dict, interner) -> tuple[Row, bool, str]:
    """The model's values for one entry's row fields (`raw`: field name -> value), with its peer group-local;
    whether its sequence number is the p2p one; its group's description. Raises EntryError naming the field a
    value cannot be read from."""
    for name in _REQUIRED:
        if name not in raw:
            raise EntryError(name, KeyError(name))
    field = "process_group"
    try:
        pg = raw["process_group"]
        group = interner.group(pg[0])
        desc = str(pg[1]) if len(pg) > 1 else ""
        field = "profiling_name"
        op, p2p_name, peer, profiling = interner.op(raw["profiling_name"])
        sizes = []
        for field in ("input_sizes", "output_sizes"):
            sizes.append(interner.size_list(raw.get(field)))
        dtypes = []
        for field in ("input_dtypes", "output_dtypes"):
            dtypes.append(interner.str_list(raw.get(field)))
        field = "state"
        state = "completed" if raw.get("retired") else _STATES.get(raw.get("state"), "issued")
        field = "thread_name"
        thread = interner.text(raw.get("thread_name"))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        raise EntryError(field, exc) from None
    row = Row(group, op, profiling, *sizes, *dtypes, peer=peer, state=state, stream=thread)
    return row, p2p_name or bool(raw.get("is_p2p")), desc


_REQUIRED = tuple(f.name for f in FIELDS if f.role == ROW and f.required)


def op_of(profiling: str) -> tuple[str, bool, int | None, str]:
    """(op, is a send or recv, group-local peer, the name as text) of a profiling name: "send 0->1" is src->dst
    and "recv 1<-0" dst<-src, so the peer is the number after the arrow."""
    name, _, meta = profiling.partition(" ")
    op = canonical_op(name) or f"other:{profiling}"
    peer = None
    if op in ("send", "recv") and meta:
        m = _P2P_META.match(meta)
        if m:
            peer = int(m.group(3))
    return op, op in ("send", "recv"), peer, str(profiling)


def group_name(raw) -> str:
    return str(raw) or DEFAULT_GROUP  # Gloo's default group: '' in pg_config, '0' in entries


def dtype_names(raw) -> list[str]:
    return [canonical_dtype(str(s)) for s in raw]  # "Float" -> "float32", as every loader


def sizes_of(raw) -> list[list[int]]:
    return [[int(d) for d in s] for s in raw]


def frame_list(raw) -> list[Frame]:
    """Flight Recorder lists frames innermost first; the model (like a traceback) innermost last."""
    return [Frame(str(f["name"]), str(f["filename"]), int(f["line"])) for f in reversed(raw)]


INT64 = (-(1 << 63), (1 << 63) - 1)  # an INT field beyond these is refused (torch writes int64)


class EntryError(ValueError):
    """A value the model cannot take from an entry: which field, and why (`at`: the entry's index, where known)."""

    def __init__(self, field: str, exc: Exception, at: int | None = None) -> None:
        what = "is missing" if isinstance(exc, KeyError) and exc.args == (field,) else \
            f"{type(exc).__name__}: {exc}"
        super().__init__(f"field {field!r} {what}" if what == "is missing" else f"field {field!r}: {what}")
        self.field, self.at = field, at
