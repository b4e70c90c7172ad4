"""How many members a group has, as the size rules of all_gather and reduce_scatter (output = n x input, input =
n x output) need it. Where a dump lists the group's members, their count; the default group spans the world. Gloo's
Flight Recorder lists no group's members: the loader infers them from the ranks whose dumps issued on the group
(trace/loaders, `_infer_groups`), and a member that left no dump (SIGKILL), or stopped before its first call there,
is not among them. Such a group's size is known only to lie between its traced members and the world: a call fits
where some size in that range fits it, and the members must then imply one size between them (match.py). Taking
the group for its traced members alone read a survivor's all_gather (output 2 x input, in a shard group of two
that lost one) as a size mismatch ahead of the lost rank."""

from __future__ import annotations

from distdoctor.collectives import implied_size
from distdoctor.trace.model import DEFAULT_GROUP, numel


def size_known(view) -> bool:
    """Whether the group's size is its members' count (match.GroupView): a dump listed them, or they are the
    whole world. A group named by the entries alone has the members that left a trace of it, and perhaps more."""
    return bool(view.members) and (not view.inferred or view.name == DEFAULT_GROUP
                                   or len(view.members) == view.world)


def sizes_fit(view, op: str, ins: list, outs: list) -> bool:
    """all_gather / reduce_scatter: output numel = n x input numel (input = n x output) for the group's size n,
    or, where that is not known (size_known), for some size from its traced members to the world. Cached per
    distinct pair of (shared) size lists, which the entries keep alive for the whole analysis."""
    if op not in ("all_gather", "reduce_scatter") or not ins or not outs:
        return True
    key = (op, id(ins), id(outs))
    ok = view.relation_ok.get(key)
    if ok is None:
        n_in, n_out = numel(ins), numel(outs)
        n = implied_size(op, n_in, n_out)
        if not n_in and not n_out:
            ok = True  # nothing moved: fits any size
        elif size_known(view):
            ok = n == len(view.members)
        else:
            ok = n >= len(view.members) and (view.world is None or n <= view.world)
        view.relation_ok[key] = ok
    return ok


def size_text(view) -> str:
    """The group's size as the size rules know it, for a finding's words."""
    if size_known(view):
        return f"{len(view.members)} ranks"
    upto = f"to {view.world}" if view.world else "or more"
    return f"{len(view.members)} {upto} ranks (its dumps list no members: a member that left none is not counted)"
