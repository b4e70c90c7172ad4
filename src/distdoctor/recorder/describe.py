"""What one torch.distributed call is about, read from its arguments without touching the data.

Each describer takes exactly the arguments of the torch.distributed function it describes (so Python's own
argument binding maps positional and keyword arguments, which is much cheaper than inspect.signature) and
returns a `Call`: the group object, whether it is async, the input and output tensors (only their shapes and
dtypes are kept by the recorder), root or peer as given (global rank, or group rank when the caller used
group_src/group_dst/group_peer), and the reduce op. The recorder turns group ranks into global ranks.

Describers build the Call with `tuple.__new__` (all ten fields, in order) rather than the NamedTuple's
generated Python-level constructor: they run on every call, and this keeps them free of an extra frame.

`DESCRIBERS` maps the function name in torch.distributed to (describer, is_p2p); the op it is recorded as is the
collective spec that has the function's name among its aliases (distdoctor.collectives.canonical_op), looked
up when patching. Names that a torch version lacks are skipped when patching.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple


class Call(NamedTuple):
    group: Any
    async_op: bool
    inputs: tuple | list
    outputs: tuple | list
    root: int | None = None
    group_root: int | None = None
    peer: int | None = None
    group_peer: int | None = None
    reduce_op: Any = None
    direction: str | None = None  # "send" | "recv" for p2p


_NONE = ()
_new = tuple.__new__


def _c(group, async_op, inputs, outputs, root=None, group_root=None, peer=None, group_peer=None, reduce_op=None,
       direction=None) -> Call:
    """Readable (slower) constructor for the rare paths."""
    return _new(Call, (group, async_op, inputs, outputs, root, group_root, peer, group_peer, reduce_op, direction))


def _all_reduce(tensor, op=None, group=None, async_op=False):
    return _new(Call, (group, async_op, (tensor,), (tensor,), None, None, None, None, op, None))


def _all_reduce_coalesced(tensors, op=None, group=None, async_op=False):
    return _new(Call, (group, async_op, tensors, tensors, None, None, None, None, op, None))


def _broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    return _new(Call, (group, async_op, (tensor,), (tensor,), src, group_src, None, None, None, None))


def _reduce(tensor, dst=None, op=None, group=None, async_op=False, group_dst=None):
    return _new(Call, (group, async_op, (tensor,), (tensor,), dst, group_dst, None, None, op, None))


def _all_gather(tensor_list, tensor, group=None, async_op=False):
    return _new(Call, (group, async_op, (tensor,), tensor_list, None, None, None, None, None, None))


def _all_gather_single(output_tensor, input_tensor, group=None, async_op=False):
    return _new(Call, (group, async_op, (input_tensor,), (output_tensor,), None, None, None, None, None, None))


def _all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op=False):
    return _c(group, async_op, input_tensor_list, [t for lst in output_tensor_lists for t in lst])


def _reduce_scatter(output, input_list, op=None, group=None, async_op=False):
    return _new(Call, (group, async_op, input_list, (output,), None, None, None, None, op, None))


def _reduce_scatter_single(output, input, op=None, group=None, async_op=False):
    return _new(Call, (group, async_op, (input,), (output,), None, None, None, None, op, None))


def _all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    return _new(Call, (group, async_op, input_tensor_list, output_tensor_list, None, None, None, None, None, None))


def _all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                       async_op=False):
    return _new(Call, (group, async_op, (input,), (output,), None, None, None, None, None, None))


def _gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    return _new(Call, (group, async_op, (tensor,), gather_list or _NONE, dst, group_dst, None, None, None, None))


def _scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    return _new(Call, (group, async_op, scatter_list or _NONE, (tensor,), src, group_src, None, None, None, None))


def _barrier(group=None, async_op=False, device_ids=None, timeout=None):
    return _new(Call, (group, async_op, _NONE, _NONE, None, None, None, None, None, None))


def _monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    return _new(Call, (group, False, _NONE, _NONE, None, None, None, None, None, None))


def _send(tensor, dst=None, group=None, tag=0, group_dst=None):
    return _new(Call, (group, False, (tensor,), _NONE, None, None, dst, group_dst, None, "send"))


def _recv(tensor, src=None, group=None, tag=0, group_src=None):
    return _new(Call, (group, False, _NONE, (tensor,), None, None, src, group_src, None, "recv"))


def _isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    return _new(Call, (group, True, (tensor,), _NONE, None, None, dst, group_dst, None, "send"))


def _irecv(tensor, src=None, group=None, tag=0, group_src=None):
    return _new(Call, (group, True, _NONE, (tensor,), None, None, src, group_src, None, "recv"))


def describe_p2p_op(p2p_op) -> Call:
    """One element of batch_isend_irecv's list (a P2POp: its peer is already a global rank)."""
    name = getattr(p2p_op.op, "__name__", "")
    if name == "irecv":
        return _c(p2p_op.group, True, _NONE, (p2p_op.tensor,), peer=p2p_op.peer, direction="recv")
    return _c(p2p_op.group, True, (p2p_op.tensor,), _NONE, peer=p2p_op.peer, direction="send")


DESCRIBERS: dict[str, tuple[Callable[..., Call], bool]] = {
    "all_reduce": (_all_reduce, False),
    "all_reduce_coalesced": (_all_reduce_coalesced, False),
    "broadcast": (_broadcast, False),
    "reduce": (_reduce, False),
    "all_gather": (_all_gather, False),
    "all_gather_into_tensor": (_all_gather_single, False),
    "all_gather_single": (_all_gather_single, False),
    "_all_gather_base": (_all_gather_single, False),
    "all_gather_coalesced": (_all_gather_coalesced, False),
    "reduce_scatter": (_reduce_scatter, False),
    "reduce_scatter_tensor": (_reduce_scatter_single, False),
    "reduce_scatter_single": (_reduce_scatter_single, False),
    "_reduce_scatter_base": (_reduce_scatter_single, False),
    "all_to_all": (_all_to_all, False),
    "all_to_all_single": (_all_to_all_single, False),
    "gather": (_gather, False),
    "scatter": (_scatter, False),
    "barrier": (_barrier, False),
    "monitored_barrier": (_monitored_barrier, False),
    "send": (_send, True),
    "recv": (_recv, True),
    "isend": (_isend, True),
    "irecv": (_irecv, True),
}
