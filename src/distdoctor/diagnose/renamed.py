"""Which collective each member's call is, where a backend's Flight Recorder records one collective under another's
name (Gloo records reduce_scatter as all_reduce: collectives/names.RECORDED_AS).

A member whose trace names its call (the recorder's `reduce_scatter`) and a member whose Gloo dump says
`all_reduce` may be in the same call. They are only where the dump has entries under that name and their sizes fit
the named op (a dump that names the call `reduce_scatter` itself renamed nothing): a Gloo `all_reduce`
entry whose output has as many elements as its input, in a group of more than one, is a real all_reduce, not a
reduce_scatter (whose output is its input over the group's size) - two different collectives, a type mismatch.
"""

from __future__ import annotations

from distdoctor.collectives import get_spec
from distdoctor.collectives.names import as_recorded, backend_of
from distdoctor.trace.model import numel


def recorded_names(present: dict, n: int) -> dict[int, str]:
    """rank -> the name its call goes by when the members' calls are compared (see the module's docstring)."""
    backends = {backend_of(e.raw_op) for e in present.values()} - {None}
    out = {}
    for r, e in present.items():
        name = e.op
        for backend in backends:
            name = as_recorded(name, backend)
        theirs = [f for f in present.values() if f.op == name and backend_of(f.raw_op) in backends]
        if name != e.op and not (theirs and all(_fits(f, e.op, n) for f in theirs)):
            name = e.op  # no entry of the backend goes by that name, or none has sizes this op could give
        out[r] = name
    return out


def _fits(entry, op: str, n: int) -> bool:
    """Can `entry`'s sizes be those of collective `op` in a group of `n`? (Unknown sizes: yes.)"""
    if not entry.in_sizes or not entry.out_sizes:
        return True
    try:
        return numel(entry.out_sizes) == get_spec(op).out_numel(numel(entry.in_sizes), n)
    except (KeyError, ValueError):
        return True
