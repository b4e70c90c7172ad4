"""Which collective each member's call is, where a backend's Flight Recorder records one collective under another's
name (Gloo records reduce_scatter as all_reduce: collectives/names.RECORDED_AS).

A member whose trace names its call (the recorder's `reduce_scatter`) and a member whose Gloo dump says
`all_reduce` may be in the same call: the recorder's call is compared as the dump would record it, by name and by
sizes. Gloo runs a reduce_scatter as an all_reduce of the whole input, in place: its dump records the call's input
as the all_reduce's input and output (on torch 2.13, an FSDP reduce_scatter [[1072]] -> [[536]] in the recorder's
trace is Gloo's all_reduce [[1072]] -> [[1072]]; compared in elements, as the list form may pass its input as
several tensors). Where the dump's entry has other sizes, it is not that call, and
the members' names, which differ, are compared as they are. Only a trace without the backend is renamed: a dump
that names its call `reduce_scatter` itself renamed nothing. A Gloo `all_reduce` that matches the record is an
all_reduce or a reduce_scatter: the dump cannot tell (`ambiguous_names` says so in a finding's words).
"""

from __future__ import annotations

from distdoctor.collectives.names import RECORDED_AS, as_recorded, backend_of
from distdoctor.trace.model import numel


def recorded_names(present: dict) -> dict[int, str]:
    """rank -> the name its call goes by when the members' calls are compared (see the module's docstring)."""
    out = {r: e.op for r, e in present.items()}
    for backend in {backend_of(e.raw_op) for e in present.values()} - {None}:
        records = {(f.op, numel(f.in_sizes), numel(f.out_sizes)) for f in present.values()
                   if backend_of(f.raw_op) == backend}
        for r, e in present.items():
            name = as_recorded(e.op, backend)
            if name != e.op and backend_of(e.raw_op) != backend and \
                    (name, numel(e.in_sizes), numel(e.in_sizes)) in records:
                out[r] = name
    return out


def ambiguous_names(present: dict, names: dict[int, str]) -> str:
    """Words for a disagreement on names where a member's dump records, under its name, a call another member
    named otherwise (a Gloo `all_reduce` may be a reduce_scatter): what that dump's entry may be."""
    notes = []
    for r in sorted(present):
        e, backend = present[r], backend_of(present[r].raw_op)
        others = sorted({op for q, op in names.items() if q != r and op != e.op
                         and RECORDED_AS.get(backend or "", {}).get(op) == e.op})
        if others:
            notes.append(f"rank {r}'s {backend} dump records {e.op} {e.in_sizes}: {'; '.join(others)} or {e.op} of "
                         f"that input ({backend} records both so), not the other members' call as it would record it")
    return "; ".join(notes)


def resized_alike(present: dict, names: dict[int, str]) -> tuple[list[int], dict[int, list[int]]] | None:
    """(the odd ranks, input elements -> ranks), where the members' names disagree only as `recorded_names` read
    them: recorded by name alone as the backend would, they agree, and the sizes are what differ (a Gloo
    `all_reduce` beside a recorder's `reduce_scatter` of another input: the same call with other sizes, or another
    collective; the dump cannot tell, and what it shows differ is the sizes). None where the names differ however
    recorded, or the sizes split evenly."""
    backends = {backend_of(e.raw_op) for e in present.values()} - {None}
    if len(backends) != 1 or len(set(names.values())) == 1:
        return None
    backend = backends.pop()
    if len({as_recorded(e.op, backend) for e in present.values()}) != 1:
        return None
    classes: dict[int, list[int]] = {}
    for r in sorted(present):
        classes.setdefault(numel(present[r].in_sizes), []).append(r)
    counts = sorted((len(rs) for rs in classes.values()), reverse=True)
    if len(counts) < 2 or counts[0] == counts[1]:
        return None
    usual = max(classes, key=lambda v: len(classes[v]))
    return sorted(r for v, rs in classes.items() if v != usual for r in rs), classes
