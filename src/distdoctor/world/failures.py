"""One reading of what a rank or a call raised: a communication failure (a peer gone or silent, the backend
aborting, the launcher stopping the rank), a timeout among those, an operation the backend does not support,
or an error of the rank's own.

Every stage that judges an exception by its text asks here, so the three answers cannot drift apart:
- the world's blame policy (blame.py): a rank that failed in communication is a victim, not a cause;
- validate: a call that failed in communication means the world broke (re-raise, the world names the lost rank),
  unlike an unsupported (op, dtype) that is reported as skipped;
- diagnose: a crash that is a communication failure is where the wave of waiting reached the rank, not its root.

The texts are those of gloo ("Connection closed by peer", "Read error ... Connection reset by peer", "Timed out
waiting 10000ms for recv", "[enforce fail at ...pair.cc]"), NCCL (DistBackendError, ncclRemoteError,
"communicator was aborted"), the OS (broken pipe, no route to host) and distdoctor's own launcher side
("terminated by the launcher"). Matching is case-insensitive. An exception raised where torch.distributed
unpickles what an object collective delivered (`raised_unpacking`) is judged by where it was raised, not its text.
"""

from __future__ import annotations

import re

TIMEOUT = r"timed out|timeout"
PEER_LOST = (r"connection (?:closed|reset|refused|timed out|lost)|closed by peer|reset by peer|broken pipe|read error|"
             r"socket|unreachable|no route to host|network is down")
BACKEND_ABORT = r"abort|EnforceNotMet|DistBackendError|nccl ?error|ncclRemoteError"
STOPPED = r"terminated by the launcher"
UNSUPPORTED = (r"not supported|unsupported|can't be cast|cannot be cast|Cannot use|not implemented|NotImplemented|"
               r"does not support|Invalid (?:usage|scalar type)|no kernel|isn't supported")

COMM_FAILURE = re.compile("|".join((TIMEOUT, PEER_LOST, BACKEND_ABORT, STOPPED)), re.IGNORECASE)
# The peer's end of the connection closed: its process ended (exited, crashed, killed), not merely silent
PEER_CLOSED = re.compile(r"closed by peer|reset by peer|connection (?:closed|reset)|broken pipe", re.IGNORECASE)
_TIMEOUT = re.compile(TIMEOUT, re.IGNORECASE)
_UNSUPPORTED = re.compile(UNSUPPORTED, re.IGNORECASE)


# torch.distributed's object collectives (broadcast_object_list, all_gather_object, ...) turn what their inner
# collectives delivered into objects in their own bodies: they size a buffer from the sizes the peers sent, then
# unpickle the bytes (`_tensor_to_object`). What is raised there, innermost (UnpicklingError, EOFError, a buffer of
# 140 TB that cannot be allocated), comes of the bytes another rank sent - a peer that took another root or size -
# and not of the rank's own code; their own checks of the caller's arguments raise ValueError or AssertionError.
OBJECT_BODIES = ("_tensor_to_object", "broadcast_object_list", "all_gather_object", "gather_object",
                 "scatter_object_list", "recv_object_list")
ARGUMENT_CHECKS = ("ValueError", "AssertionError")


def raised_unpacking(where: str | None, exc_type: str = "") -> bool:
    """The innermost frame of an exception (`name (file:line)`) is an object collective's body in
    torch.distributed, turning delivered bytes into objects, and the exception is no check of its arguments."""
    name, _, rest = str(where or "").partition(" (")
    return (name.strip() in OBJECT_BODIES and "torch/distributed" in rest.replace("\\", "/")
            and exc_type.rsplit(".", 1)[-1] not in ARGUMENT_CHECKS)


def is_comm_failure(text: str) -> bool:
    """The error came from communicating with other ranks (or the launcher stopping this one), not from the
    rank's own code: a timeout, a lost peer or link, an aborted collective."""
    return COMM_FAILURE.search(text) is not None


def is_timeout(text: str) -> bool:
    """A communication failure that is a wait running out (as opposed to a connection that broke)."""
    return _TIMEOUT.search(text) is not None


def is_unsupported(text: str) -> bool:
    """The backend cannot do this operation (op, dtype, reduction): a fact about the backend, not a failure."""
    return _UNSUPPORTED.search(text) is not None
