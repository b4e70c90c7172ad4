"""The simulator's program IR: parse YAML/JSON, validate with positions, and write it back.

A program is `groups` (communicator name -> member ranks), an optional `cost` model, and per rank its
`buffers` (counting semaphores with a capacity) and `streams` (name -> ordered ops). Op kinds:

    compute {us, name}                 record {event}        wait {event}
    acquire {buffer}                   release {buffer}
    collective {group, kind, bytes|us, name, root}
    send {peer, bytes|us, name, tag}   recv {peer, bytes|us, name, tag}
    comm_init {group, us, name}        (creating a communicator: collective over the group's members)

`tag` (an extension, default "") separates independent point-to-point channels between the same pair of
ranks, as separate communicators do; FIFO matching is per (sender, receiver, tag). An optional top-level
`p2p: {eager_bytes: B}` lets each channel buffer B bytes of sends that complete before their receive (as
NCCL's connection buffers and MPI's eager protocol do); without it every send waits for its receive.

Two layers: pydantic models check the *shape* of what a user wrote (types, unknown ops and fields); the
result is the compact `Program` (plain dataclasses and one NamedTuple per op) that generators also emit
directly, and `check_program` does the *semantic* checks on it (unknown group, rank not in group, recv with
no possible sender, a wait whose event only the same stream records later, ...). Every error is an
`InputError` whose `what` names the position: "plan.yaml: rank 0 stream fwd op 3".
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, NamedTuple, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt, TypeAdapter
from pydantic import ValidationError

from distdoctor.errors import InputError

# IR collective kinds -> collective spec names (distdoctor.collectives); both spellings are accepted.
COLLECTIVE_KINDS = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce",
    "all_to_all": "all_to_all", "alltoall": "all_to_all",
    "gather": "gather", "scatter": "scatter", "barrier": "barrier",
}
MAX_BYTES = 1 << 62  # an op's bytes: 4 EiB, far beyond any message a job sends
OP_KINDS = ("compute", "record", "wait", "acquire", "release", "collective", "send", "recv", "comm_init")


class Op(NamedTuple):
    """One op in its compact form (what the engine compiles). Fields not used by an op kind stay None/""."""

    op: str
    name: str = ""
    us: float | None = None
    group: str = ""
    kind: str = ""  # collective spec name
    bytes: int = 0
    peer: int = -1
    tag: str = ""
    event: str = ""
    buffer: str = ""
    root: int | None = None


def label(op: Op) -> str:
    """How an op is named in reports: short, and says what it touches."""
    k = op.op
    if k == "compute":
        return f"compute {op.name}" if op.name else "compute"
    if k in ("record", "wait"):
        return f"{k} {op.event}"
    if k in ("acquire", "release"):
        return f"{k} {op.buffer}"
    if k == "collective":
        return f"{op.kind} on {op.group}" + (f" ({op.name})" if op.name else "")
    if k == "comm_init":
        return f"comm_init of {op.group}" + (f" ({op.name})" if op.name else "")
    arrow = "to" if k == "send" else "from"
    return f"{k} {arrow} {op.peer}" + (f" ({op.name})" if op.name else "")


@dataclass
class Cost:
    alpha_us: float = 5.0
    gbps: float = 100.0  # GB/s per rank link, as nccl-tests' busbw


@dataclass
class RankProgram:
    buffers: dict[str, int] = field(default_factory=dict)
    streams: dict[str, list[Op]] = field(default_factory=dict)


@dataclass
class Program:
    groups: dict[str, list[int]]
    ranks: dict[int, RankProgram]
    cost: Cost = field(default_factory=Cost)
    source: str = "<program>"  # file name used in error positions and trace frames
    eager_bytes: int = 0  # per-channel buffer for sends that complete before their receive (0: none)

    def op_count(self) -> int:
        return sum(len(ops) for rp in self.ranks.values() for ops in rp.streams.values())


# ---- shape: pydantic models of what a user writes ------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Compute(_Strict):
    op: Literal["compute"]
    us: NonNegativeFloat
    name: str = ""


class _Record(_Strict):
    op: Literal["record"]
    event: str
    name: str = ""


class _Wait(_Strict):
    op: Literal["wait"]
    event: str
    name: str = ""


class _Acquire(_Strict):
    op: Literal["acquire"]
    buffer: str
    name: str = ""


class _Release(_Strict):
    op: Literal["release"]
    buffer: str
    name: str = ""


class _Collective(_Strict):
    op: Literal["collective"]
    group: str
    kind: str
    bytes: NonNegativeInt = 0
    us: NonNegativeFloat | None = None
    name: str = ""
    root: int | None = None


class _P2P(_Strict):
    peer: int
    bytes: NonNegativeInt = 0
    us: NonNegativeFloat | None = None
    name: str = ""
    tag: str = ""


class _Send(_P2P):
    op: Literal["send"]


class _CommInit(_Strict):
    op: Literal["comm_init"]
    group: str
    us: NonNegativeFloat | None = None
    name: str = ""


class _Recv(_P2P):
    op: Literal["recv"]


_OpModel = Annotated[Union[_Compute, _Record, _Wait, _Acquire, _Release, _Collective, _Send, _Recv, _CommInit],
                     Field(discriminator="op")]
_OP_ADAPTER = TypeAdapter(_OpModel)


class _Cost(_Strict):
    alpha_us: NonNegativeFloat = 5.0
    gbps: float = Field(100.0, gt=0)


class _P2PModel(_Strict):
    eager_bytes: NonNegativeInt = 0


class _Rank(_Strict):
    buffers: dict[str, PositiveInt] = {}
    streams: dict[str, list[dict]] = {}


class _Program(_Strict):
    groups: dict[str, list[int]] = {}
    cost: _Cost = _Cost()
    p2p: _P2PModel = _P2PModel()
    ranks: dict[str, _Rank]


def _why(exc: ValidationError, skip: int = 0) -> str:
    err = exc.errors()[0]
    parts = list(err["loc"])[skip:]
    if parts and parts[0] in OP_KINDS:  # the discriminated union names the op kind first: drop it
        parts = parts[1:]
    loc = ".".join(str(p) for p in parts if not isinstance(p, int) or len(parts) == 1)
    if err["type"] == "union_tag_invalid":
        return f"unknown op {err['input'].get('op')!r} (expected one of: {', '.join(OP_KINDS)})"
    if err["type"] == "union_tag_not_found":
        return f"no 'op' field (expected one of: {', '.join(OP_KINDS)})"
    msg = re.sub(r" or instance of _\w+", "", err["msg"])
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    if err["type"] in ("greater_than_equal", "greater_than") and isinstance(err.get("input"), (int, float)):
        msg = f"must not be negative (got {err['input']})" if err["type"] == "greater_than_equal" else \
            f"must be positive (got {err['input']})"
    return f"{loc}: {msg}" if loc else msg


def parse_text(text: str, source: str) -> Program:
    """Parse YAML or JSON text (JSON is YAML) into a checked Program."""
    try:
        raw = yaml.safe_load(text)
    except RecursionError:
        raise InputError(source, "not valid YAML/JSON (nested too deeply)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        why = " ".join(str(getattr(exc, "problem", None) or exc).split())  # yaml's reader errors span lines
        raise InputError(source, f"not valid YAML/JSON{where} ({why})") from None
    if not isinstance(raw, dict):
        raise InputError(source, "expected a mapping with 'groups', 'cost', 'p2p' and 'ranks'")
    try:
        ranks_raw = raw.get("ranks")
        if isinstance(ranks_raw, dict):  # YAML reads `0:` as an int key
            ranks_raw = {str(k): v for k, v in ranks_raw.items()}
        top = _Program.model_validate({**raw, "ranks": ranks_raw})
    except ValidationError as exc:
        loc = exc.errors()[0]["loc"]
        where, skip = source, 0
        if len(loc) >= 3 and loc[0] == "ranks":
            where, skip = f"{source}: rank {loc[1]}", 2
            if len(loc) >= 5 and loc[2] == "streams":
                where, skip = f"{where} stream {loc[3]}", 4
                if isinstance(loc[4], int):
                    where, skip = f"{where} op {loc[4]}", 5
        raise InputError(where, _why(exc, skip)) from None
    ranks: dict[int, RankProgram] = {}
    for key, rk in top.ranks.items():
        try:
            r = int(key)
        except ValueError:
            raise InputError(f"{source}: rank {key}", "rank keys must be integers") from None
        if r < 0:
            raise InputError(f"{source}: rank {key}", "rank must not be negative")
        streams: dict[str, list[Op]] = {}
        for sname, ops in rk.streams.items():
            compact = []
            for i, raw_op in enumerate(ops):
                try:
                    m = _OP_ADAPTER.validate_python(raw_op)
                except ValidationError as exc:
                    raise InputError(f"{source}: rank {r} stream {sname} op {i}", _why(exc)) from None
                compact.append(_compact(m, source, r, sname, i))
            streams[sname] = compact
        ranks[r] = RankProgram(buffers=dict(rk.buffers), streams=streams)
    prog = Program(groups={g: list(m) for g, m in top.groups.items()}, ranks=ranks,
                   cost=Cost(top.cost.alpha_us, top.cost.gbps), source=source, eager_bytes=top.p2p.eager_bytes)
    check_program(prog)
    return prog


def _compact(m: BaseModel, source: str, r: int, s: str, i: int) -> Op:
    if isinstance(m, _Collective):
        kind = COLLECTIVE_KINDS.get(m.kind.lower())
        if kind is None:
            raise InputError(f"{source}: rank {r} stream {s} op {i}",
                             f"unknown collective kind {m.kind!r} (expected one of: "
                             f"{', '.join(sorted(set(COLLECTIVE_KINDS.values())))})")
        return Op("collective", m.name, m.us, group=m.group, kind=kind, bytes=m.bytes, root=m.root)
    if isinstance(m, (_Send, _Recv)):
        return Op(m.op, m.name, m.us, bytes=m.bytes, peer=m.peer, tag=m.tag)
    if isinstance(m, _Compute):
        return Op("compute", m.name, m.us)
    if isinstance(m, _CommInit):
        return Op("comm_init", m.name, m.us, group=m.group, kind="comm_init")
    if isinstance(m, (_Record, _Wait)):
        return Op(m.op, m.name, event=m.event)
    return Op(m.op, m.name, buffer=m.buffer)


def read_text(path: str | Path) -> str:
    """A plan file's text, or an InputError naming the file and why it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InputError(str(path), exc.strerror or str(exc)) from None
    except UnicodeDecodeError:
        raise InputError(str(path), "not a text file") from None


def load_program(path: str | Path) -> Program:
    return parse_text(read_text(path), Path(path).name)


# ---- semantics ---------------------------------------------------------------------------------------------

def check_program(prog: Program) -> None:
    """Semantic checks that need the whole program. Raises InputError naming the first bad position."""
    src = prog.source
    if not prog.ranks:
        raise InputError(src, "no ranks")
    for g, members in prog.groups.items():
        if not members:
            raise InputError(f"{src}: group {g}", "has no members")
        if len(set(members)) != len(members):
            raise InputError(f"{src}: group {g}", f"lists a rank twice ({members})")
        for m in members:
            if m not in prog.ranks:
                raise InputError(f"{src}: group {g}", f"member {m} is not a rank of the program")
    members_of = {g: set(m) for g, m in prog.groups.items()}
    sends: Counter = Counter()  # (src, dst, tag) -> count
    recvs: dict[tuple[int, int, str], list[tuple[str, int]]] = defaultdict(list)
    for r, rp in prog.ranks.items():
        created: dict[str, tuple[str, int]] = {}  # group -> (stream, op index) of this rank's comm_init
        recorded: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for s, ops in rp.streams.items():
            for i, op in enumerate(ops):
                if op.op == "record":
                    recorded[op.event].append((s, i))
        for s, ops in rp.streams.items():
            for i, op in enumerate(ops):
                where = f"{src}: rank {r} stream {s} op {i}"
                k = op.op
                if op.us is not None and op.us < 0:
                    raise InputError(where, f"negative duration us={op.us}")
                if op.bytes < 0:
                    raise InputError(where, f"negative bytes={op.bytes}")
                if op.bytes > MAX_BYTES:  # (times are floats: a 10**400-byte message cannot even be costed)
                    raise InputError(where, "bytes beyond any real message (more than 2**62)")
                if k in ("acquire", "release") and op.buffer not in rp.buffers:
                    raise InputError(where, f"unknown buffer {op.buffer!r} (rank {r} declares: "
                                            f"{', '.join(rp.buffers) or 'none'})")
                elif k == "wait":
                    recs = recorded.get(op.event)
                    if not recs:
                        raise InputError(where, f"waits for event {op.event!r}, which no stream of rank {r} records")
                    if all(rs == s and ri > i for rs, ri in recs):
                        raise InputError(where, f"waits for event {op.event!r}, which only this stream records "
                                                f"later (op {recs[0][1]}): a cyclic wait on one stream")
                elif k in ("collective", "comm_init"):
                    if op.group not in members_of:
                        raise InputError(where, f"unknown group {op.group!r} (groups: "
                                                f"{', '.join(prog.groups) or 'none'})")
                    if r not in members_of[op.group]:
                        raise InputError(where, f"rank {r} is not in group {op.group!r} {prog.groups[op.group]}")
                    if op.root is not None and op.root not in members_of[op.group]:
                        raise InputError(where, f"root {op.root} is not in group {op.group!r}")
                    if k == "comm_init":
                        if op.group in created:
                            s0, i0 = created[op.group]
                            raise InputError(where, f"creates communicator {op.group!r} a second time (first at "
                                                    f"stream {s0} op {i0}); a rank creates a communicator once")
                        created[op.group] = (s, i)
                        used = next((j for j, o in enumerate(ops[:i]) if o.op == "collective" and o.group == op.group),
                                    None)
                        if used is not None:
                            raise InputError(where, f"creates communicator {op.group!r} after op {used} of the same "
                                                    f"stream already used it")
                elif k in ("send", "recv"):
                    if op.peer not in prog.ranks:
                        raise InputError(where, f"peer {op.peer} is not a rank of the program")
                    if op.peer == r:
                        raise InputError(where, f"{k} to itself")
                    if k == "send":
                        sends[(r, op.peer, op.tag)] += 1
                    else:
                        recvs[(op.peer, r, op.tag)].append((s, i))
    for key, posted in recvs.items():
        if len(posted) > sends[key]:
            s, i = posted[sends[key]]
            tag = f" with tag {key[2]!r}" if key[2] else ""
            raise InputError(f"{src}: rank {key[1]} stream {s} op {i}",
                             f"recv from {key[0]}{tag} has no possible sender (rank {key[0]} sends "
                             f"{sends[key]} time(s){tag} to rank {key[1]}, this is receive #{sends[key] + 1})")
    for key, n in sends.items():
        if n > len(recvs.get(key, ())):
            tag = f" with tag {key[2]!r}" if key[2] else ""
            raise InputError(f"{src}: rank {key[0]}",
                             f"sends {n} time(s) to rank {key[1]}{tag} but rank {key[1]} receives only "
                             f"{len(recvs.get(key, ()))}: a send with no possible receiver")


# ---- writing the IR back -----------------------------------------------------------------------------------

def op_to_dict(op: Op) -> dict:
    d: dict = {"op": op.op}
    k = op.op
    if k == "compute":
        d["us"] = op.us
    elif k in ("record", "wait"):
        d["event"] = op.event
    elif k in ("acquire", "release"):
        d["buffer"] = op.buffer
    elif k == "collective":
        d.update(group=op.group, kind=op.kind, bytes=op.bytes)
        if op.root is not None:
            d["root"] = op.root
    elif k == "comm_init":
        d["group"] = op.group
    else:
        d.update(peer=op.peer, bytes=op.bytes)
        if op.tag:
            d["tag"] = op.tag
    if op.us is not None and k != "compute":
        d["us"] = op.us
    if op.name:
        d["name"] = op.name
    return d


def program_to_dict(prog: Program) -> dict:
    return {
        "groups": {g: list(m) for g, m in prog.groups.items()},
        "cost": {"alpha_us": prog.cost.alpha_us, "gbps": prog.cost.gbps},
        **({"p2p": {"eager_bytes": prog.eager_bytes}} if prog.eager_bytes else {}),
        "ranks": {str(r): {"buffers": dict(rp.buffers),
                           "streams": {s: [op_to_dict(op) for op in ops] for s, ops in rp.streams.items()}}
                  for r, rp in sorted(prog.ranks.items())},
    }


class _FlowDumper(yaml.SafeDumper):
    pass


def _dict_representer(dumper, data):
    # Ops are one line each ({op: compute, us: 100, name: fwd_mb0}), like the example.
    flow = "op" in data
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


def _list_representer(dumper, data):
    flow = all(isinstance(x, int) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_FlowDumper.add_representer(dict, _dict_representer)
_FlowDumper.add_representer(list, _list_representer)


def dump_program(prog: Program, path: str | Path, header: str = "") -> None:
    """Write the IR as YAML (or JSON when the name ends in .json)."""
    data = program_to_dict(prog)
    p = Path(path)
    if p.suffix == ".json":
        p.write_text(json.dumps(data, indent=1) + "\n")
        return
    text = yaml.dump(data, Dumper=_FlowDumper, sort_keys=False, width=200)
    if header:
        text = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines()) + text
    p.write_text(text)
