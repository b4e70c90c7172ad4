"""Recording how a rank creates its process groups: `new_group`, `new_subgroups`, `new_subgroups_by_enumeration`
and `init_device_mesh`, in order, with their arguments and caller frames.

`distdoctor lint` compares these sequences across ranks (group_creation_order): torch names groups by creation
order and NCCL creates communicators lazily, so ranks that create groups in different orders hang under some
layouts. Creations are rare (a handful per job), so the wrappers may bind arguments with inspect; the collective
hot path is untouched. Only the outermost creation is recorded (init_device_mesh calls new_group); nothing stops
collectives inside a creation from being recorded as usual (their sequence numbers must stay Flight Recorder's).
The dump carries them in its header as `group_creations` (trace/model.py), a list of
{"index", "api", "ranks", "group_size", "desc", "local", "mesh_shape", "dim_names", "group", "groups", "t",
"frames"}; readers that do not know the key ignore it.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time

CREATION_FRAMES = 6
MAX_KEPT = 4096  # creations kept per rank (a job makes a handful; a loop making thousands keeps its last ones)
_tls = threading.local()
_originals: list[tuple[object, str, object]] = []  # (module, name, original)


def _group_name(c10d, pg) -> str | None:
    try:
        if pg is None or pg is c10d.GroupMember.NON_GROUP_MEMBER:
            return None
        return str(c10d._get_process_group_name(pg))
    except Exception:
        return None


def _describe(api: str, bound: dict, result, c10d) -> dict:
    out: dict = {"api": api, "desc": bound.get("group_desc")}
    if api == "new_group":
        ranks = bound.get("ranks")
        out["ranks"] = sorted(int(r) for r in ranks) if ranks else None
        out["local"] = bool(bound.get("use_local_synchronization"))
        out["group"] = _group_name(c10d, result)
    elif api == "new_subgroups":
        out["group_size"] = bound.get("group_size")
        out["group"] = _group_name(c10d, result[0] if isinstance(result, tuple) else None)
    elif api == "new_subgroups_by_enumeration":
        lists = bound.get("ranks_per_subgroup_list") or []
        out["ranks"] = [sorted(int(r) for r in rs) for rs in lists]
        out["group"] = _group_name(c10d, result[0] if isinstance(result, tuple) else None)
    elif api == "init_device_mesh":
        out["mesh_shape"] = [int(d) for d in bound.get("mesh_shape") or ()]
        names = bound.get("mesh_dim_names")
        out["dim_names"] = list(names) if names else None
        groups = []
        try:
            for dim in range(len(out["mesh_shape"])):
                groups.append(_group_name(c10d, result.get_group(dim)))
        except Exception:
            pass
        out["groups"] = groups
    return out


def _wrap(api: str, orig, c10d, patch_module):
    signature = inspect.signature(orig)

    @functools.wraps(orig)
    def traced(*args, **kwargs):
        rec = patch_module.current
        if rec is None or getattr(_tls, "creating", False):
            return orig(*args, **kwargs)
        t = time.time()
        frames = patch_module.caller_frames(sys._getframe(1), CREATION_FRAMES)
        _tls.creating = True
        try:
            result = orig(*args, **kwargs)
        finally:
            _tls.creating = False
        try:
            bound = signature.bind(*args, **kwargs).arguments
            rec.record_creation({**_describe(api, bound, result, c10d), "t": t}, frames)
        except Exception:  # never break the user's group creation for the record's sake
            pass
        return result

    traced._distdoctor_original = orig
    return traced


def install(c10d, dist, patch_module) -> None:
    """Wrap the creation functions in c10d, torch.distributed and torch.distributed.device_mesh."""
    mesh = sys.modules.get("torch.distributed.device_mesh")
    for module, names in ((c10d, ("new_group", "new_subgroups", "new_subgroups_by_enumeration")),
                          (mesh, ("init_device_mesh",))):
        for name in names:
            orig = getattr(module, name, None) if module is not None else None
            if orig is None or hasattr(orig, "_distdoctor_original"):
                continue
            wrapper = _wrap(name, orig, c10d, patch_module)
            for target in (module, dist):
                if getattr(target, name, None) is orig:
                    _originals.append((target, name, orig))
                    setattr(target, name, wrapper)


def uninstall() -> None:
    while _originals:
        module, name, orig = _originals.pop()
        setattr(module, name, orig)
