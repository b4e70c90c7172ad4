"""Fault injection for the health monitor: prove each check catches what it claims, on the right rank.

The faults are the one grammar's (world/faults.py, docs/validate.md "Fault injection"), applied from training step
`at_step` on:
  drift:RANK[:PARAM]   after the optimizer step, move one element of PARAM (default: the first parameter)
                       by one ulp on RANK — the smallest possible divergence between replicas (a number in
                       PARAM's place moves the first parameter by that amount instead)
  nan:RANK:LAYER       LAYER's forward output gets a NaN on RANK at that step (once)
  slow:RANK[:SECONDS]  RANK sleeps SECONDS (default 0.05) in every forward from that step on — a straggler
  mem:RANK[:MIB]       RANK allocates and holds MIB (default 512) MiB at that step — memory imbalance
"""

from __future__ import annotations

import math
import time

import torch

from distdoctor.errors import InputError
from distdoctor.world.faults import HEALTH_KINDS, Fault, parse_fault

def parse_injection(spec: str, world_size: int | None = None) -> Fault:
    return parse_fault(spec, HEALTH_KINDS, world_size)


class Injector:
    """Plants one fault to a model on its rank. Call `after_step(step)` after optimizer.step()."""

    def __init__(self, injection: Fault | None, model: torch.nn.Module, rank: int, at_step: int = 3):
        self.injection = injection if injection is not None and injection.rank == rank else None
        self.model, self.at_step = model, at_step
        self.step = 0
        self._held = None
        self._handle = None
        inner = getattr(model, "module", model)
        if self.injection is None:
            return
        kind, arg = self.injection.kind, self.injection.arg
        if kind == "nan":
            modules = dict(inner.named_modules())
            if arg not in modules:
                raise InputError(f"--inject {self.injection}", f"no layer named {arg!r}; layers: "
                                 f"{', '.join(n for n in modules if n)}")
            # prepend: the NaN must be in the layer's output before any observer (the monitor) sees it
            self._handle = modules[arg].register_forward_hook(self._nan_hook, prepend=True)
        elif kind == "slow":
            self._handle = inner.register_forward_pre_hook(self._slow_hook)
        elif kind == "drift":
            params = dict(inner.named_parameters())
            name = arg if isinstance(arg, str) else next(iter(params))
            if name not in params:
                raise InputError(f"--inject {self.injection}", f"no parameter named {arg!r}")
            self._drift_param = params[name]

    def _nan_hook(self, module, args, out):
        if self.step != self.at_step or not torch.is_tensor(out):
            return None
        out = out.clone()
        out.view(-1)[0] = math.nan
        return out

    def _slow_hook(self, module, args):
        if self.step >= self.at_step:
            time.sleep(self.injection.arg)

    def after_step(self) -> None:
        inj = self.injection
        if inj is not None and self.step == self.at_step:
            if inj.kind == "drift":
                with torch.no_grad():
                    flat = self._drift_param.data.view(-1)
                    if isinstance(inj.arg, float):  # an amount (parity's spelling)
                        flat[0] += inj.arg
                    else:  # one ulp: the smallest divergence there is
                        flat[0] = torch.nextafter(flat[0], torch.tensor(math.inf, dtype=flat.dtype, device=flat.device))
            elif inj.kind == "mem":
                self._held = torch.ones(int(inj.arg * 2**20) // 4, dtype=torch.float32)
        self.step += 1
