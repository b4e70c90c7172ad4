"""Reading a pickled Flight Recorder dump without trusting it.

A dump is untrusted input: `SafeUnpickler` builds only builtin containers and scalars and refuses every global
(no class, no function, no __reduce__ callable can be named, so nothing in the file can run), and the address
space is capped while it runs so a hostile memo request fails at once instead of exhausting memory."""

from __future__ import annotations

import contextlib
import io
import pickle

try:
    import resource
except ImportError:  # pragma: no cover - not on this platform (Windows): no address-space cap
    resource = None


def _latin1_bytes(text: str, encoding: str = "latin1") -> bytes:
    """Protocol-2 pickles spell bytes as _codecs.encode(str, 'latin1'); nothing else is allowed through."""
    if encoding not in ("latin1", "latin-1") or not isinstance(text, str):
        raise pickle.UnpicklingError(f"refused to load _codecs.encode with encoding {encoding!r}")
    return text.encode("latin1")


# The only names a dump may refer to: builders of builtin containers (older protocols spell them as globals).
PICKLE_ALLOWED = {("builtins", "set"): set, ("builtins", "frozenset"): frozenset,
                  ("__builtin__", "set"): set, ("__builtin__", "frozenset"): frozenset,
                  ("_codecs", "encode"): _latin1_bytes}

class SafeUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, sets, str, bytes, numbers, bools and None; refuses anything else."""

    def find_class(self, module: str, name: str):  # noqa: D102 - the whole point of this class
        if (module, name) in PICKLE_ALLOWED:
            return PICKLE_ALLOWED[(module, name)]
        raise pickle.UnpicklingError(
            f"refused to load {module}.{name}: a Flight Recorder dump holds only builtin containers and scalars")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent reference: not a Flight Recorder dump")


# A corrupt or hostile pickle can PUT into memo slot 2**32 - 1: CPython's C unpickler then allocates and zeroes
# 16 bytes per slot up to it (64 GiB) before reading on, which takes minutes or gets the process OOM-killed. While
# a dump is unpickled the address space may grow only by what a real dump can need (its objects take a few dozen
# times its size; its memo 16 bytes per opcode), so such a request fails at once with MemoryError.
UNPICKLE_HEADROOM = 256 << 20  # bytes, plus UNPICKLE_PER_BYTE per byte of the dump
UNPICKLE_PER_BYTE = 64


@contextlib.contextmanager
def _address_space_capped(extra: int):
    """Lower RLIMIT_AS to the current address space + `extra` bytes for the duration (process-wide: only the
    CLI's loaders run here). No cap where /proc or RLIMIT_AS is unavailable or a lower one is already set."""
    limits = None
    if resource is not None:
        try:
            with open("/proc/self/statm") as f:
                size = int(f.read().split()[0]) * resource.getpagesize()
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            cap = size + extra if hard == resource.RLIM_INFINITY else min(size + extra, hard)
            if soft == resource.RLIM_INFINITY or soft > cap:
                resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
                limits = (soft, hard)
        except (OSError, ValueError):
            limits = None
    try:
        yield
    finally:
        if limits is not None:
            resource.setrlimit(resource.RLIMIT_AS, limits)


def printable(text: str) -> str:
    """The unpickler quotes bytes of the file in its messages as they are (`invalid load key, '\n'`, a FLOAT
    opcode's line): escape what is not printable, so a reason stays one line and puts no control byte on a
    terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def safe_unpickle(data: bytes) -> object:
    """Unpickle untrusted bytes; raise ValueError with the reason on refusal or corruption."""
    try:
        with _address_space_capped(UNPICKLE_HEADROOM + UNPICKLE_PER_BYTE * len(data)):
            return SafeUnpickler(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        msg = printable(str(exc))
        raise ValueError(msg if msg.startswith("refused") else f"corrupt or truncated pickle ({msg})") from None
    except (EOFError, IndexError):
        raise ValueError("truncated pickle (ends before its STOP opcode)") from None
    except RecursionError:
        raise ValueError("pickle nested too deeply") from None
    except MemoryError:
        raise ValueError("pickle asks for more memory than is available") from None
    except Exception as exc:  # corrupt opcodes raise a zoo of types (KeyError, ValueError, struct.error, ...)
        raise ValueError(f"corrupt pickle ({type(exc).__name__}: {printable(str(exc))})") from None
