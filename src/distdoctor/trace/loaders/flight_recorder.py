"""PyTorch Flight Recorder dumps (versions 2.x, NCCL and Gloo styles) -> RankTrace.

Two physical forms carry the same dict:
- pickle: what `torch._C._distributed_c10d._dump_fr_trace` / `_dump_nccl_trace` return and what
  `TORCH_FR_DUMP_TEMP_FILE<rank>` holds. A dump is untrusted input, so it is read with `SafeUnpickler`, which
  builds only builtin containers and scalars and refuses every global (no class, no function, no __reduce__
  callable can be named, so nothing in the file can run).
- JSON: `_dump_fr_trace_json` (no stack frames; `time_discovered_*` are 0 instead of None; pg_status values
  are strings).

Fields read (torch/csrc/distributed/c10d/FlightRecorder*.cpp, flight_recorder/components/*.py):
top level `version`, `pg_config` {name: {name, desc, ranks: "[0, 1]"}}, `entries`; per entry `record_id`,
`process_group` (name, desc), `collective_seq_id`, `p2p_seq_id`, `is_p2p`, `profiling_name` ("nccl:all_reduce",
"nccl:send 0->1", "nccl:recv 1<-0", group-local ranks), `input_sizes`/`output_sizes`/`*_dtypes`, `state`
(scheduled/started/completed), `retired`, `time_created_ns`, `time_discovered_{started,completed}_ns`,
`thread_name`, `frames`.

Quirks handled here (checked on torch 2.13 Gloo dumps): the default group is `''` in pg_config but `'0'` in
entries; pg_config may list no members (membership is then inferred across the trace set, see
loaders/__init__.py); Gloo entries stay `scheduled` and signal completion only by `retired`; Gloo records no
p2p. FR does not record broadcast/reduce roots, so `root` stays None.
"""

from __future__ import annotations

import io
import json
import pickle
import re

from distdoctor.collectives import canonical_op
from distdoctor.trace.model import DEFAULT_GROUP, Entry, Frame, GroupInfo, RankTrace

PICKLE_ALLOWED = {("builtins", "set"), ("builtins", "frozenset")}
_P2P_META = re.compile(r"^\s*(\d+)\s*(->|<-)\s*(\d+)\s*$")
_RANK_SUFFIX = re.compile(r"(\d+)$")
_KNOWN_EXT = (".pkl", ".pickle", ".json", ".jsonl", ".bin", ".txt", ".dump", ".fr")


class SafeUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, str, bytes, numbers, bools and None; refuses anything else."""

    def find_class(self, module: str, name: str):  # noqa: D102 - the whole point of this class
        if (module, name) in PICKLE_ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(
            f"refused to load {module}.{name}: a Flight Recorder dump holds only builtin containers and scalars")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent reference: not a Flight Recorder dump")


def safe_unpickle(data: bytes) -> object:
    """Unpickle untrusted bytes; raise ValueError with the reason on refusal or corruption."""
    try:
        return SafeUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise ValueError(str(exc)) from None
    except (EOFError, IndexError):
        raise ValueError("truncated pickle (ends before its STOP opcode)") from None
    except RecursionError:
        raise ValueError("pickle nested too deeply") from None
    except MemoryError:
        raise ValueError("pickle asks for more memory than is available") from None
    except Exception as exc:  # corrupt opcodes raise a zoo of types (KeyError, ValueError, struct.error, ...)
        raise ValueError(f"corrupt pickle ({type(exc).__name__}: {exc})") from None


def rank_from_filename(path: str) -> int | None:
    """`nccl_trace_rank_3`, `dump_3.pkl`, `fr_3.json` -> 3 (the last number before a known extension)."""
    base = path.rsplit("/", 1)[-1]
    for ext in _KNOWN_EXT:
        if base.lower().endswith(ext):
            base = base[: -len(ext)]
            break
    m = _RANK_SUFFIX.search(base)
    return int(m.group(1)) if m else None


def looks_like_fr(obj: object) -> bool:
    return isinstance(obj, dict) and "entries" in obj and "version" in obj


def _parse_ranks(raw: object) -> list[int]:
    if isinstance(raw, str):
        raw = json.loads(raw) if raw.strip() else []
    if not isinstance(raw, (list, tuple)):
        raise ValueError(f"pg_config ranks is {type(raw).__name__}, not a list")
    return sorted(int(r) for r in raw)


def _ns(value: object) -> float | None:
    if not value:
        return None
    return int(value) / 1e9


class _Interner:
    """Shares equal size/dtype lists between entries: a dump repeats a few shapes thousands of times."""

    def __init__(self) -> None:
        self.sizes: dict[tuple, list] = {}
        self.strs: dict[tuple, list] = {}
        self.empty_frames: list[Frame] = []

    def size_list(self, raw) -> list[list[int]]:
        if not raw:
            return []
        key = tuple(tuple(s) for s in raw)
        got = self.sizes.get(key)
        if got is None:
            got = self.sizes[key] = [[int(d) for d in s] for s in raw]
        return got

    def str_list(self, raw) -> list[str]:
        if not raw:
            return []
        key = tuple(raw)
        got = self.strs.get(key)
        if got is None:
            got = self.strs[key] = [str(s) for s in raw]
        return got


def parse_fr_dump(obj: object, path: str, source: str, rank: int | None = None,
                  interner: _Interner | None = None) -> RankTrace:
    """Normalize one Flight Recorder dump dict. Raises ValueError(reason)."""
    if not looks_like_fr(obj):
        raise ValueError("not a Flight Recorder dump (no 'version' and 'entries')")
    version = str(obj["version"])
    if not version.startswith("2."):
        raise ValueError(f"unsupported Flight Recorder version {version!r} (2.x is supported)")
    if rank is None:
        rank = obj.get("rank") if isinstance(obj.get("rank"), int) else rank_from_filename(path)
    if rank is None:
        raise ValueError("cannot tell which rank this dump is from: name it with a rank suffix (e.g. rank_3)")
    interner = interner or _Interner()
    trace = RankTrace(rank=rank, source=source, path=path, version=version)

    pg_config = obj.get("pg_config") or {}
    if not isinstance(pg_config, dict):
        raise ValueError(f"pg_config is {type(pg_config).__name__}, not a dict")
    for key, cfg in pg_config.items():
        if not isinstance(cfg, dict):
            raise ValueError(f"pg_config[{key!r}] is {type(cfg).__name__}, not a dict")
        name = str(cfg.get("name", key)) or DEFAULT_GROUP  # Gloo: the default group is '' here, '0' in entries
        try:
            members = _parse_ranks(cfg.get("ranks", []))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"pg_config[{key!r}] ranks unreadable ({exc})") from None
        trace.groups[name] = GroupInfo(name=name, ranks=members, inferred=False, desc=str(cfg.get("desc", "")))
        if name == DEFAULT_GROUP and members:
            trace.world_size = len(members)

    entries = obj["entries"]
    if not isinstance(entries, list):
        raise ValueError(f"'entries' is {type(entries).__name__}, not a list")
    local_peers: list[tuple[Entry, int]] = []
    empty_frames = interner.empty_frames
    for i, raw in enumerate(entries):
        try:
            entry, local_peer = _parse_entry(raw, i, interner, empty_frames)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            what = f"missing key {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise ValueError(f"entry {i} is malformed ({what})") from None
        trace.entries.append(entry)
        if local_peer is not None:
            local_peers.append((entry, local_peer))
        desc = raw["process_group"][1] if len(raw["process_group"]) > 1 else ""
        if entry.group not in trace.groups:
            # Membership not given: the trace-set loader infers it from who issued on the group.
            trace.groups[entry.group] = GroupInfo(name=entry.group, ranks=[], inferred=True, desc=str(desc))
        elif not trace.groups[entry.group].desc:
            trace.groups[entry.group].desc = str(desc)
    for entry, local in local_peers:
        members = trace.groups[entry.group].ranks
        if members and local < len(members):
            entry.peer = members[local]
        elif entry.group == DEFAULT_GROUP:
            entry.peer = local  # default group: local rank == global rank
    return trace


def _parse_entry(raw: dict, i: int, interner: _Interner, empty_frames: list) -> tuple[Entry, int | None]:
    group = str(raw["process_group"][0]) or DEFAULT_GROUP
    profiling = str(raw["profiling_name"])
    name, _, meta = profiling.partition(" ")
    op = canonical_op(name) or f"other:{profiling}"
    is_p2p = bool(raw.get("is_p2p")) or op in ("send", "recv")
    local_peer = None
    if is_p2p and meta:
        m = _P2P_META.match(meta)
        if m:  # "send 0->1" (src->dst), "recv 1<-0" (dst<-src), group-local ranks
            # "send 0->1" is src->dst and "recv 1<-0" is dst<-src: the peer is the number after the arrow.
            local_peer = int(m.group(3))
    state_raw = raw.get("state")
    if raw.get("retired") or state_raw == "completed":
        state = "completed"
    elif state_raw == "started":
        state = "started"
    else:
        state = "issued"
    frames_raw = raw.get("frames")
    frames = ([Frame(str(f["name"]), str(f["filename"]), int(f["line"])) for f in frames_raw]
              if frames_raw else empty_frames)
    seq = raw.get("collective_seq_id")
    p2p_seq = raw.get("p2p_seq_id")
    entry = Entry(
        index=int(raw.get("record_id", i)), group=group, op=op,
        seq=None if is_p2p else (int(seq) if seq is not None else None),
        p2p_seq=int(p2p_seq) if is_p2p and p2p_seq is not None else None,
        raw_op=profiling,
        in_sizes=interner.size_list(raw.get("input_sizes")), out_sizes=interner.size_list(raw.get("output_sizes")),
        in_dtypes=interner.str_list(raw.get("input_dtypes")), out_dtypes=interner.str_list(raw.get("output_dtypes")),
        state=state, t_created=_ns(raw.get("time_created_ns")),
        t_started=_ns(raw.get("time_discovered_started_ns")), t_completed=_ns(raw.get("time_discovered_completed_ns")),
        stream=raw.get("thread_name") or None, frames=frames,
    )
    return entry, local_peer


def load_fr_pickle(data: bytes, path: str, interner: _Interner | None = None) -> RankTrace:
    obj = safe_unpickle(data)
    return parse_fr_dump(obj, path, "flight_recorder-pickle", interner=interner)


def load_fr_json(obj: dict, path: str, interner: _Interner | None = None) -> RankTrace:
    return parse_fr_dump(obj, path, "flight_recorder-json", interner=interner)
