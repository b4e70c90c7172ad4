"""Where a NaN/Inf first appeared: the module, the pass (forward or backward), the rank and the step.

Forward: a forward hook on every module appends the module's floating-point outputs to a per-step list;
the root module's hook (the last to fire) computes the infinity norm of all of them in ONE fused call
(`torch._foreach_norm(..., inf)` — max |x|, which never overflows and propagates NaN) and keeps the small
result on the device, so there is no host sync inside the forward. Forward hooks fire when a module
returns, children before parents, so the first non-finite entry in that list is the innermost module whose
own computation produced it; a parent is named when the non-finite value came from its own functional code.

Backward: a tensor hook on every parameter takes the infinity norm of the parameter's *local* gradient
(before DDP averages it — after the all-reduce every rank would look guilty) and records it in backward
execution order. The first non-finite one names the module that owns the parameter.

Nothing is read on the host until `collect()` is called once per step (by HealthMonitor.step, after the
loss has been read anyway): the cost per step is one Python callback per module and parameter and one fused
reduction per pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass
class NonFinite:
    step: int
    phase: str  # "forward" | "backward" | "loss"
    module: str  # module name ("" for the root), or the loss
    parameter: str = ""  # backward: the parameter whose gradient was non-finite
    value: float = math.nan  # the offending infinity norm (nan or inf)


def _float_tensors(out) -> list[torch.Tensor]:
    if torch.is_tensor(out):
        return [out.detach()] if out.is_floating_point() or out.is_complex() else []
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _float_tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _float_tensors(o)]
    return []


class NanOrigin:
    def __init__(self, model: torch.nn.Module, check_backward: bool = True):
        self.root = model
        inner = getattr(model, "module", model)
        self._names = {m: name for name, m in inner.named_modules()}
        self._names[model] = self._names.get(model, "")
        self._fwd_names: list[str] = []
        self._fwd_tensors: list[torch.Tensor] = []
        self._fwd_results: list[tuple[list[str], torch.Tensor]] = []
        self._bwd_names: list[str] = []
        self._bwd_norms: list[torch.Tensor] = []
        self._handles = []
        for module, name in self._names.items():
            if module is model:
                continue
            self._handles.append(module.register_forward_hook(self._make_fwd_hook(name)))
        self._handles.append(model.register_forward_hook(self._root_hook))
        owner = {id(p): (mname, pname) for mname, m in inner.named_modules() for pname, p in m.named_parameters(recurse=False)}
        if check_backward:
            for p in inner.parameters():
                if p.requires_grad and id(p) in owner:
                    mname, pname = owner[id(p)]
                    self._handles.append(p.register_hook(self._make_bwd_hook(mname, f"{mname}.{pname}" if mname else pname)))

    def _make_fwd_hook(self, name: str):
        names, tensors = self._fwd_names, self._fwd_tensors

        def hook(module, args, out):
            for t in _float_tensors(out):
                names.append(name)
                tensors.append(t)

        return hook

    def _root_hook(self, module, args, out):
        for t in _float_tensors(out):
            self._fwd_names.append(self._names.get(module, ""))
            self._fwd_tensors.append(t)
        if self._fwd_tensors:
            norms = torch.stack(torch._foreach_norm(self._fwd_tensors, math.inf))
            self._fwd_results.append((list(self._fwd_names), norms))
        self._fwd_names.clear()
        self._fwd_tensors.clear()

    def _make_bwd_hook(self, module_name: str, param_name: str):
        names, norms = self._bwd_names, self._bwd_norms

        def hook(grad):
            if grad is not None and (grad.is_floating_point() or grad.is_complex()):
                names.append(f"{module_name}\0{param_name}")
                norms.append(torch.linalg.vector_norm(grad.detach(), math.inf))
            return None

        return hook

    def collect(self, step: int, loss_finite: bool) -> NonFinite | None:
        """Read this step's checks (one host sync) and clear them. None when everything was finite."""
        found = None
        for names, norms in self._fwd_results:
            bad = ~torch.isfinite(norms)
            if found is None and bool(bad.any()):
                i = int(torch.nonzero(bad)[0])
                found = NonFinite(step, "forward", names[i] or "<model>", value=float(norms[i]))
        if found is None and not loss_finite:
            found = NonFinite(step, "loss", "<loss>")
        if found is None and self._bwd_norms:
            norms = torch.stack(self._bwd_norms)
            bad = ~torch.isfinite(norms)
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0])
                module, param = self._bwd_names[i].split("\0")
                found = NonFinite(step, "backward", module or "<model>", parameter=param, value=float(norms[i]))
        self._fwd_results.clear()
        self._bwd_names.clear()
        self._bwd_norms.clear()
        return found

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
