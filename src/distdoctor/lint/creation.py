"""group_creation_order: process groups or DeviceMesh dimensions created in different orders on different ranks.

torch names a group by a counter of the groups the process created (non-local `new_group`: every rank must
call it for every group, in one order), and NCCL makes communicators lazily, on a group's first collective:
two ranks that create or first use groups in different orders work under one layout and hang under another
(Megatron-LM PR #5240, pp4 x vp2). The recorder writes every `new_group`, `new_subgroups(_by_enumeration)` and
`init_device_mesh` call into its dump header (`group_creations`, recorder/creations.py); Flight Recorder keeps
none, so only the recorder's dumps carry this evidence.

A creation is known across ranks by what it asked for: the API, the members (when every rank makes every group),
the description (`group_desc`), the mesh's shape and dimension names; a locally synchronized group (each rank
makes only its own) by its API, description and call site. Ranks whose creations, restricted to those both made,
come in a different order from the most common order are the hazard.
"""

from __future__ import annotations

from distdoctor.findings.kinds import fmt_ranks
from distdoctor.diagnose.sites import fmt_chain, user_chain
from distdoctor.lint.hazard import Hazard
from distdoctor.trace.model import Frame, TraceSet


def _site(c: dict) -> str | None:
    try:
        frames = [Frame(str(f["name"]), str(f["filename"]), int(f["line"])) for f in c.get("frames") or []]
    except (KeyError, TypeError, ValueError):
        return None
    chain = user_chain(frames)
    return fmt_chain(chain) if chain else None


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


def key(c: dict) -> tuple:
    """What a creation asked for, the same on every rank that made the same group."""
    api = c.get("api")
    common = (api, c.get("desc") or "", _freeze(c.get("mesh_shape")), _freeze(c.get("dim_names")),
              c.get("group_size"))
    if c.get("local") or api in ("new_subgroups", "new_subgroups_by_enumeration"):
        return (*common, _site(c))  # each rank makes only its own: the members differ by design
    return (*common, _freeze(c.get("ranks")))


def _label(c: dict) -> str:
    api = c.get("api")
    if api == "init_device_mesh":
        names = c.get("dim_names")
        return f"init_device_mesh{tuple(c.get('mesh_shape') or ())}" + (f" {tuple(names)}" if names else "")
    what = f"ranks {c.get('ranks')}" if c.get("ranks") is not None else f"size {c.get('group_size')}"
    desc = f" '{c['desc']}'" if c.get("desc") else ""
    return f"{api}({what}){desc}"


def _numbered(creations: list[dict]) -> list[tuple]:
    """Keys with their occurrence number (a loop can ask for the same thing twice)."""
    seen: dict[tuple, int] = {}
    out = []
    for c in creations:
        k = key(c)
        seen[k] = seen.get(k, 0) + 1
        out.append((k, seen[k]))
    return out


def find(ts: TraceSet) -> list[Hazard]:
    made = {r: t.group_creations for r, t in sorted(ts.ranks.items()) if t.group_creations}
    if len(made) < 2:
        return []
    classes: dict[tuple, list[int]] = {}
    for r, creations in made.items():
        classes.setdefault(tuple(_numbered(creations)), []).append(r)
    if len(classes) < 2:
        return []
    ref_seq, ref_ranks = max(classes.items(), key=lambda kv: (len(kv[1]), -kv[1][0]))
    where = {k: i for i, k in enumerate(ref_seq)}
    hazards = []
    for seq, ranks in classes.items():
        if seq is ref_seq:
            continue
        common = [k for k in seq if k in where]
        inv = next(((a, b) for a, b in zip(common, common[1:]) if where[a] > where[b]), None)
        if inv is None:
            continue  # same order, some made more or fewer groups (locally synchronized ones)
        hazards.append(_hazard(ts, made, ref_ranks, ranks, ref_seq, seq, inv))
    return hazards


def _at(creations: list[dict], numbered: list[tuple], k: tuple) -> dict:
    return creations[numbered.index(k)]


def _hazard(ts, made, ref_ranks, ranks, ref_seq, seq, inv) -> Hazard:
    b, a = inv  # these ranks made b before a; the reference ranks a before b
    rr, rs = ref_ranks[0], ranks[0]
    ref_c, its_c = made[rr], made[rs]
    ra, rb = _at(ref_c, list(ref_seq), a), _at(ref_c, list(ref_seq), b)
    sa, sb = _at(its_c, list(seq), a), _at(its_c, list(seq), b)
    groups = sorted({str(c.get("group")) for c in (ra, rb, sa, sb) if c.get("group") is not None})
    h = Hazard("group_creation_order", ref_ranks + ranks, groups, "")
    h.detail = (f"{fmt_ranks(ref_ranks)} create{'s' if len(ref_ranks) == 1 else ''} {_label(ra)} before {_label(rb)}, {fmt_ranks(ranks)} the other "
                f"way round: torch numbers groups in creation order and NCCL creates communicators when a group is "
                f"first used, so the same group gets different names on different ranks, or ranks wait in "
                f"different communicators' set-up; it works in this layout by luck and can hang in another.")
    for rk, first, second in ((ref_ranks, ra, rb), (ranks, sb, sa)):
        h.add_site(rk, f"created {_label(first)} at", _site(first))
        h.add_site(rk, f"then {_label(second)} at", _site(second))
    h.evidence = {"order": {fmt_ranks(ref_ranks): [_label(ra), _label(rb)], fmt_ranks(ranks): [_label(sb), _label(sa)]}}
    return h
