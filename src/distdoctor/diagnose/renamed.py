"""Which collective each member's call is, where a backend's Flight Recorder records one collective under another's
name (Gloo records reduce_scatter as all_reduce, with the sizes of the all_reduce it runs:
collectives/names.RECORDED_AS).

A member whose trace names its call (the recorder's `reduce_scatter`) and a member whose Gloo dump says
`all_reduce` may be in the same call: the recorder's name is compared as the dump would give it. Only where the
dump has entries under that name, though: a dump that names the call `reduce_scatter` itself renamed nothing, and
then a recorder's `reduce_scatter` is that, not an `all_reduce`. Where the dump's `all_reduce` was a real
all_reduce, the two cannot be told apart (the sizes a Gloo reduce_scatter records are an all_reduce's).
"""

from __future__ import annotations

from distdoctor.collectives.names import as_recorded, backend_of


def recorded_names(present: dict) -> dict[int, str]:
    """rank -> the name its call goes by when the members' calls are compared (see the module's docstring)."""
    backends = {backend_of(e.raw_op) for e in present.values()} - {None}
    renamed_to = {f.op for f in present.values() if backend_of(f.raw_op) in backends}
    out = {}
    for r, e in present.items():
        name = e.op
        for backend in backends:
            name = as_recorded(name, backend)
        out[r] = name if name in renamed_to else e.op
    return out
