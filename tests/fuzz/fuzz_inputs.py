"""Input mutators for the fuzz targets: structural mutations of real dumps, byte damage, hostile pickles.

The seeds are real Flight Recorder dumps from a 2-rank Gloo job (torch 2.13, tests/fuzz/data/) and a native
distdoctor trace built here. Structural mutations walk the decoded object, pick places and delete keys,
replace values with junk of the wrong type (None, huge or negative numbers, inf/nan, markup, deep nesting),
wrap them in lists or swap the version; the result is re-encoded (pickle or JSON). Byte mutations truncate,
flip and insert bytes in the encoded file.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
from pathlib import Path

from hypothesis import strategies as st

DATA = Path(__file__).parent / "data"
FR_PICKLE = (DATA / "fr_pickle_rank_0").read_bytes()
FR_JSON = (DATA / "fr_json_rank_0.json").read_text()
# Our own fixture, written by torch in a test job: trusted, so the plain unpickler is fine here.
FR_OBJ = pickle.loads(FR_PICKLE)
FR_JSON_OBJ = json.loads(FR_JSON)

VERSIONS = ["2.10", "2.0", "2.4", "1.0", "3.0", "99.99", "", "2.x", None, 2.1, -1, ["2.10"]]
# A fresh copy per draw: `["2.10"]` put into a case as is would be the one list in VERSIONS, and a later
# mutation of that case (delete/replace/wrap at its index) would change VERSIONS for every case after it. Then
# the same choices no longer give the same places to pick from, and hypothesis stops the run with
# FlakyStrategyDefinition. A strategy must only hand out objects that no other case can reach.
versions = st.sampled_from(VERSIONS).map(copy.deepcopy)


def deep(depth: int, leaf=0):
    """A list nested `depth` deep, built without recursion."""
    obj = leaf
    for _ in range(depth):
        obj = [obj]
    return obj


def junk_values(max_depth: int = 3000):
    """Values of the wrong type; lists nested up to max_depth (past Python's recursion limit of 1000)."""
    return st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([10**30, -10**30, 2**63, 2**64 + 1, -1, 10**400]),
        st.text(max_size=30), st.just("<script>alert('x')</script>"), st.binary(max_size=10),
        st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=4),
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
        st.integers(min_value=1, max_value=max_depth).map(deep),
    )


junk = junk_values()


def _places(obj, out, depth=0):
    """Every (container, key) in obj, breadth of the dump is small so this stays cheap."""
    if depth > 6:
        return out
    if isinstance(obj, dict):
        for k in list(obj):
            out.append((obj, k))
            _places(obj[k], out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i in range(len(obj)):
            if isinstance(obj, list):
                out.append((obj, i))
            _places(obj[i], out, depth + 1)
    return out


@st.composite
def mutated_structure(draw, seed, max_mutations: int = 4, allow_bytes: bool = True, max_depth: int = 3000):
    """`seed` with 1..max_mutations structural mutations. Every draw must be a function of the earlier draws
    only, so the object mutated here must share nothing mutable with the seed, the constants or earlier cases
    (hence the deep copy, and `versions` rather than VERSIONS); `junk` builds fresh containers on each draw."""
    values = junk if max_depth == 3000 else junk_values(max_depth)
    obj = copy.deepcopy(seed)
    for _ in range(draw(st.integers(1, max_mutations))):
        action = draw(st.sampled_from(["delete", "replace", "replace", "wrap", "version", "top"]))
        if action == "top":
            return draw(values) if draw(st.booleans()) else obj
        if action == "version" and isinstance(obj, dict):
            obj["version"] = draw(versions)
            continue
        places = _places(obj, [])
        if not places:
            break
        container, key = draw(st.sampled_from(places))
        if action == "delete":
            if isinstance(container, dict):
                del container[key]
            else:
                container.pop(key)
        elif action == "wrap":
            container[key] = [container[key]]
        else:
            value = draw(values)
            if not allow_bytes and isinstance(value, bytes):
                value = value.hex()
            container[key] = value
    return obj


@st.composite
def damaged_bytes(draw, data: bytes):
    kind = draw(st.sampled_from(["truncate", "flip", "insert", "empty", "garbage"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "empty":
        return b""
    if kind == "garbage":
        return draw(st.binary(max_size=200))
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        pos = draw(st.integers(0, len(buf) - 1))
        if kind == "flip":
            buf[pos] ^= draw(st.integers(1, 255))
        else:
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(buf)


def deep_pickle(depth: int) -> bytes:
    """A pickle of a list nested `depth` deep, written opcode by opcode (pickle.dumps would recurse)."""
    return b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b"."


# ---- pickles that try to run code -----------------------------------------------------------------------------

class _Reduce:
    """An object whose unpickling calls fn(*args): the classic pickle exploit."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def hostile_pickles(marker: Path) -> dict[str, bytes]:
    """Pickles that, if unpickled by a permissive unpickler, create `marker` (each in its own way)."""
    import builtins
    import subprocess

    cmd = f"touch {marker}"
    code = f"open({str(marker)!r}, 'w').write('pwned')"
    dump = copy.deepcopy(FR_OBJ)
    dump["entries"][0]["frames"][0]["name"] = _Reduce(os.system, cmd)
    nested = copy.deepcopy(FR_OBJ)
    nested["pg_config"] = {"": _Reduce(builtins.exec, code)}
    m = str(marker).encode()
    return {
        "os.system at top": pickle.dumps(_Reduce(os.system, cmd)),
        "os.system inside a real dump": pickle.dumps(dump),
        "exec inside pg_config": pickle.dumps(nested),
        "eval": pickle.dumps(_Reduce(builtins.eval, code)),
        "subprocess.Popen": pickle.dumps(_Reduce(subprocess.Popen, ["touch", str(marker)])),
        # Hand-written opcodes, as an attacker would: GLOBAL + REDUCE (protocol 0), INST, STACK_GLOBAL.
        "GLOBAL posix.system": b"cposix\nsystem\n(V" + cmd.encode() + b"\ntR.",
        "INST os.system": b"(V" + cmd.encode() + b"\nios\nsystem\n.",
        "STACK_GLOBAL builtins.exec": (b"\x80\x04\x8c\x08builtins\x94\x8c\x04exec\x94\x93\x94\x8c"
                                       + bytes([len(code)]) + code.encode() + b"\x94\x85\x94R\x94."),
        "getattr chain": pickle.dumps(_Reduce(getattr(builtins, "__import__"), "os")) + b"",
        "copyreg reconstructor": b"\x80\x02ccopyreg\n_reconstructor\nq\x00cos\n_wrap_close\nq\x01c__builtin__\nobject\nq\x02N\x87q\x03Rq\x04.",
        "open file for write": pickle.dumps(_Reduce(open, str(marker), "w")),
        "pathlib touch via marker name": b"cpathlib\nPath\n(V" + m + b"\ntR.",
    }


def write(tmpdir: str, name: str, data: bytes | str) -> str:
    path = os.path.join(tmpdir, name)
    with open(path, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return path


def json_text(obj) -> str | None:
    """JSON for obj, or None when it cannot be encoded (e.g. bytes, or too deep for the encoder)."""
    try:
        return json.dumps(obj)
    except (TypeError, ValueError, RecursionError):
        return None
