"""Where a NaN/Inf first appeared: the module, the pass (forward or backward), the rank and the step.

Two modes: `Sentinel` (the default) watches only the model's output and its gradient every step and, when
one goes non-finite, replays that step's forward with a `NanOrigin` attached; `NanOrigin` alone hooks every
module on every step (no optimizer needed, and it also localizes a NaN born in the backward at once).

The test for "non-finite" is a plain sum: NaN and Inf propagate through a sum (Inf + -Inf is NaN), and a
sum is the cheapest full read of a tensor (~0.1 ns per element on one CPU core, 30x cheaper than
`isfinite().all()` or an infinity norm). Half-precision tensors are summed in float32, so only a tensor
whose values add up beyond 3e38 would read as non-finite without being so.

Forward: a forward hook on every module collects its floating-point outputs; a forward pre-hook on the root
starts a pass and the root's forward hook (the last to fire) sums them all and keeps the small result on
the device (no host sync inside the forward). Forward hooks fire when a module returns, children before
parents, so the first non-finite entry is the innermost module whose own computation produced it; a
parent is named when the value came from its own functional code.

Backward: activation-sized, not parameter-sized. A tensor hook on the output of every leaf module sums the
gradient arriving at that output, in backward execution order. The gradient at leaf L_i's output is made by
the backward of the modules that ran after it, so when the gradient at L_i's output is the first non-finite
one and the one at the next leaf's output, L_(i+1), was still finite, the origin is L_(i+1)'s backward (or
functional code between the two): that module is named, with the pair as evidence. For a non-sequential
model (residual branches) the pair is the honest statement. Optionally (`param_grads=True`) the local
gradient of every parameter is summed too (before DDP averages it), which also catches a NaN that appears
only in a weight gradient — at the cost of a full read of all gradients each step.

Nothing is read on the host until `collect()` runs once per step (HealthMonitor.step, after the loss has
been read anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class NonFinite:
    step: int
    phase: str  # "forward" | "backward" | "loss" | "update" (found as non-finite parameters after that step's update)
    module: str  # module name, "<model>" for the root, "<loss>" for the loss
    parameter: str = ""  # backward with param_grads: the parameter whose local gradient was non-finite
    between: list[str] = field(default_factory=list)  # backward: [leaf whose output grad was first bad, next leaf]


def _float_tensors(out) -> list[torch.Tensor]:
    if torch.is_tensor(out):
        return [out] if out.is_floating_point() or out.is_complex() else []
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _float_tensors(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _float_tensors(o)]
    return []


def _sum(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.sum(dtype=torch.float32) if t.element_size() < 4 else t.sum()


class _Pass:
    """One forward pass and the backward that follows it."""

    def __init__(self):
        self.fwd_names: list[str] = []
        self.fwd_tensors: list[torch.Tensor] = []
        self.fwd_sums: torch.Tensor | None = None
        self.seen: set[int] = set()  # a parent returning its last child's output: check that tensor once
        self.leaves: list[str] = []  # leaf modules in forward order
        self.bwd: list[tuple[str, object, torch.Tensor]] = []  # ("out", leaf index, sum) | ("param", name, sum)


class NanOrigin:
    def __init__(self, model: torch.nn.Module, param_grads: bool = False):
        self.root = model
        inner = getattr(model, "module", model)
        self._names = {m: (name or "<model>") for name, m in inner.named_modules()}
        self._names.setdefault(model, "<model>")
        self._passes: list[_Pass] = []
        self._current: _Pass | None = None
        self._handles = [model.register_forward_pre_hook(self._root_pre_hook)]
        for module, name in self._names.items():
            if module is not model:
                leaf = next(module.children(), None) is None
                self._handles.append(module.register_forward_hook(self._make_fwd_hook(name, leaf)))
        self._handles.append(model.register_forward_hook(self._root_hook))
        if param_grads:
            for mname, m in inner.named_modules():
                for pname, p in m.named_parameters(recurse=False):
                    if p.requires_grad:
                        full = f"{mname}.{pname}" if mname else pname
                        self._handles.append(p.register_hook(self._make_param_hook(mname or "<model>", full)))

    def _root_pre_hook(self, module, args):
        self._current = _Pass()

    def _make_fwd_hook(self, name: str, leaf: bool):
        def hook(module, args, out):
            p = self._current
            if p is None:  # a submodule called outside the root's forward
                return
            tensors = _float_tensors(out)
            for t in tensors:
                if id(t) not in p.seen:
                    p.seen.add(id(t))
                    p.fwd_names.append(name)
                    p.fwd_tensors.append(t.detach())
            if leaf:
                idx = len(p.leaves)
                p.leaves.append(name)
                if torch.is_grad_enabled():
                    for t in tensors:
                        if t.requires_grad:
                            t.register_hook(self._make_out_grad_hook(p, idx))

        return hook

    @staticmethod
    def _make_out_grad_hook(p: _Pass, idx: int):
        def hook(grad):
            p.bwd.append(("out", idx, _sum(grad)))

        return hook

    def _make_param_hook(self, module_name: str, param_name: str):
        def hook(grad):
            p = self._passes[-1] if self._passes else None
            if p is not None:
                p.bwd.append(("param", (module_name, param_name), _sum(grad)))

        return hook

    def _root_hook(self, module, args, out):
        p = self._current
        if p is None:
            return
        for t in _float_tensors(out):
            if id(t) not in p.seen:
                p.fwd_names.append(self._names.get(module, "<model>"))
                p.fwd_tensors.append(t.detach())
        p.seen = set()
        if p.fwd_tensors:
            p.fwd_sums = torch.stack([_sum(t) for t in p.fwd_tensors])
        p.fwd_tensors = []
        self._passes.append(p)
        self._current = None

    def collect(self, step: int, loss_finite: bool) -> NonFinite | None:
        """Read this step's checks (one host sync) and clear them. None when everything was finite."""
        passes, self._passes = self._passes, []
        sums = [p.fwd_sums for p in passes if p.fwd_sums is not None]
        sums += [torch.stack([s for _, _, s in p.bwd]) for p in passes if p.bwd]
        if loss_finite and (not sums or bool(torch.isfinite(torch.cat(sums)).all())):
            return None  # the common case: one fused check, one sync
        for p in passes:
            if p.fwd_sums is not None:
                bad = torch.nonzero(~torch.isfinite(p.fwd_sums)).flatten()
                if bad.numel():
                    return NonFinite(step, "forward", p.fwd_names[int(bad[0])])
        if not loss_finite:
            return NonFinite(step, "loss", "<loss>")
        for p in passes:
            for kind, where, s in p.bwd:
                if bool(torch.isfinite(s)):
                    continue
                if kind == "param":
                    return NonFinite(step, "backward", where[0], parameter=where[1])
                nxt = p.leaves[where + 1] if where + 1 < len(p.leaves) else "<loss>"
                return NonFinite(step, "backward", nxt, between=[p.leaves[where], nxt])
        return None

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


class Sentinel:
    """Cheap per-step NaN watch that finds the origin only when something went wrong (the default mode).

    Per step it costs two hooks on the root module, one on the root's output gradient and one optimizer
    step pre-hook: the root's output and the gradient arriving at it are summed (tiny tensors) and checked
    once, before the optimizer updates anything. Only when one is non-finite does it replay that step's
    forward — same parameters (not yet updated), same inputs, same RNG state, buffers restored afterwards — on
    the unwrapped module with full per-module hooks (NanOrigin), which names the module. The replay runs no
    collective (the inner module, not the DDP wrapper), so one rank can do it alone.

    A NaN born in the backward with finite forward and loss shows up one step later as non-finite
    parameters; the replay of that later step then finds the first module with non-finite output holding
    non-finite parameters, and the origin is reported at the previous step with phase "update": the last
    module (in forward order) whose parameters went non-finite, with the next leaf as the other side. Under
    DDP every rank gets the averaged non-finite gradient, so such a record does not say which rank made it;
    a rank that saw the NaN directly at that step (forward, loss) is preferred over it.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.inner = getattr(model, "module", model)
        self.found: NonFinite | None = None
        self.step = 0
        self._args = None
        self._rng = None
        self._flags: list[torch.Tensor] = []
        self._handles = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                         model.register_forward_hook(self._post),
                         optimizer.register_step_pre_hook(self._before_update)]

    def _pre(self, module, args, kwargs):
        self._args = (args, kwargs)
        self._rng = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)

    def _post(self, module, args, out):
        for t in _float_tensors(out):
            self._flags.append(_sum(t))
            if t.requires_grad:
                t.register_hook(lambda g: self._flags.append(_sum(g)))

    def _before_update(self, optimizer, args, kwargs):
        flags, self._flags = self._flags, []
        if self.found is not None or not flags or bool(torch.isfinite(torch.stack(flags)).all()):
            return
        self.found = self._replay() or NonFinite(self.step, "loss", "<loss>")

    def _replay(self) -> NonFinite | None:
        if self._args is None:
            return None
        args, kwargs = self._args
        buffers = {n: b.detach().clone() for n, b in self.inner.named_buffers()}
        rng_now = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None)
        probe = NanOrigin(self.inner)
        try:
            torch.set_rng_state(self._rng[0])
            if self._rng[1] is not None:
                torch.cuda.set_rng_state_all(self._rng[1])
            with torch.no_grad():
                self.inner(*args, **kwargs)
            order = probe._passes[-1].leaves if probe._passes else []
            found = probe.collect(self.step, True)
        finally:
            probe.remove()
            with torch.no_grad():
                for n, b in self.inner.named_buffers():
                    b.copy_(buffers[n])
            torch.set_rng_state(rng_now[0])
            if rng_now[1] is not None:
                torch.cuda.set_rng_state_all(rng_now[1])
        if found is None or found.phase != "forward":
            return None
        modules = dict(self.inner.named_modules())
        culprit = modules.get(found.module if found.module != "<model>" else "")
        if culprit is not None and any(not bool(torch.isfinite(p).all()) for p in culprit.parameters()):
            return self._from_parameters(order)
        return found

    def _from_parameters(self, leaves: list[str]) -> NonFinite:
        """Parameters already non-finite: the previous update brought a non-finite gradient.

        `leaves`: leaf modules in the replay's forward execution order."""
        bad = [n for n in leaves if any(not bool(torch.isfinite(p).all()) for p in self.inner.get_submodule(n if n != "<model>" else "").parameters(recurse=False))]
        last = bad[-1] if bad else "<model>"
        nxt = leaves[leaves.index(last) + 1] if last in leaves and leaves.index(last) + 1 < len(leaves) else "<loss>"
        return NonFinite(max(0, self.step - 1), "update", nxt, between=[last, nxt])

    def collect(self, step: int, loss_finite: bool) -> NonFinite | None:
        found, self.found = self.found, None
        self.step = step + 1
        if found is None and not loss_finite:
            found = NonFinite(step, "loss", "<loss>")
        return found

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
