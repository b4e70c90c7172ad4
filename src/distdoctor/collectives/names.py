"""One vocabulary for what traces call collectives and dtypes, whatever wrote them.

Flight Recorder spells dtypes the C++ way (`Float`, `BFloat16`, `Long`) and op names with a backend prefix
(`nccl:all_reduce`, `gloo:_allgather_base`, `nccl:coalesced`); distdoctor's recorder writes torch's Python names
(`float32`, `bfloat16`, `int64`; `all_reduce`). Every loader maps both to the names below, so traces of one job
written in different forms compare equal. The op names themselves are the collective specs' (see __init__:
`canonical_op`); this module holds the facts about names that are not a spec's.
"""

from __future__ import annotations

import functools

# torch's Python dtype names, keyed by every spelling a trace may use (lower-cased): c10's ScalarType names as
# Flight Recorder writes them, torch's aliases (`float`, `long`, `cfloat`), and the names themselves.
_DTYPE_ALIASES = {
    "byte": "uint8", "char": "int8", "short": "int16", "int": "int32", "long": "int64",
    "half": "float16", "float": "float32", "double": "float64",
    "complexhalf": "complex32", "complexfloat": "complex64", "complexdouble": "complex128",
    "cfloat": "complex64", "cdouble": "complex128", "chalf": "complex32",
    "bfloat16": "bfloat16", "bool": "bool",
    "qint8": "qint8", "quint8": "quint8", "qint32": "qint32", "quint4x2": "quint4x2", "quint2x4": "quint2x4",
    "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "float8_e5m2": "float8_e5m2", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2fnuz": "float8_e5m2fnuz",
    "float8_e4m3fnuz": "float8_e4m3fnuz", "float8_e8m0fnu": "float8_e8m0fnu",
    "float4_e2m1fn_x2": "float4_e2m1fn_x2",
}
for _name in ("uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex32",
              "complex64", "complex128"):
    _DTYPE_ALIASES[_name] = _name


@functools.lru_cache(maxsize=1024)
def canonical_dtype(name: str) -> str:
    """`Float`, `torch.float32`, `float` -> `float32`; an unknown name is kept (without a `torch.` prefix)."""
    text = str(name).strip()
    if text.startswith("torch."):
        text = text[6:]
    return _DTYPE_ALIASES.get(text.lower(), text)


# Flight Recorder's marker of a coalesced block (`nccl:coalesced`): the entries of the block share its sequence
# number, and the marker closes it.
COALESCED = "coalesced"

# Collectives a backend records under another collective's name. Gloo has no reduce_scatter of its own: it
# all_reduces the whole input and keeps its slice, so its Flight Recorder shows `gloo:all_reduce` where the
# program called reduce_scatter (checked on torch 2.13: reduce_scatter_tensor and the list form).
RECORDED_AS = {"gloo": {"reduce_scatter": "all_reduce"}}


def backend_of(raw_op: str | None) -> str | None:
    """`gloo:all_reduce` -> `gloo`; None for a name without a backend prefix (the recorder's)."""
    if not raw_op or ":" not in raw_op:
        return None
    return raw_op.split(":", 1)[0].strip().lower() or None


def as_recorded(op: str, backend: str | None) -> str:
    """The name `backend`'s Flight Recorder gives collective `op`."""
    return RECORDED_AS.get(backend or "", {}).get(op, op)


def same_collective(op_a: str, raw_a: str | None, op_b: str, raw_b: str | None) -> bool:
    """Whether two entries can be the same call: equal names, or one side's backend records the other's op under
    its name (a gloo Flight Recorder `all_reduce` may be a reduce_scatter the recorder saw)."""
    if op_a == op_b:
        return True
    return as_recorded(op_b, backend_of(raw_a)) == op_a or as_recorded(op_a, backend_of(raw_b)) == op_b


def dtype_signature(in_dtypes: list[str], out_dtypes: list[str]) -> str:
    """What the members of a collective must agree on about dtypes: the distinct dtypes of a call's inputs (its
    outputs when it passes none), in order. A list of n tensors of one dtype is that dtype: a scatter's root
    passes n inputs where the others pass none (they only receive), a gather's root n outputs."""
    return "/".join(dict.fromkeys(in_dtypes or out_dtypes))
