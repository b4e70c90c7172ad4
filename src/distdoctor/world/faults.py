"""Fault injection for `validate` (and anything else that runs collectives): `--inject KIND:RANK[:ARG]`.

Kinds, each shown to be caught by a real check:
- `corrupt:RANK[:N]`  perturb RANK's output after every collective (or only the N-th, 1-based): the result
                      check and the cross-rank hash name RANK;
- `delay:RANK:SECONDS` RANK sleeps SECONDS before every collective (a straggler): results stay right, the
                      arrival check (how long each rank waited for the others) names RANK;
- `crash:RANK[:N]`    RANK exits before its N-th collective (default 1): the survivors stop on the world's
                      timeout and the lost-rank report names RANK and the collective;
- `skip:RANK[:N]`     RANK skips its N-th collective (default 1), like an asymmetric code path: the per-rank
                      sequence of collectives entered names RANK.
Faults are plain data (JSON-able) so they travel to workers in the job's arguments.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

from distdoctor.errors import InputError

KINDS = ("corrupt", "delay", "crash", "skip")
CRASH_EXIT_CODE = 17


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    nth: int | None = None  # 1-based collective index it applies to; None = every collective
    seconds: float = 0.0

    def __str__(self) -> str:
        arg = f":{self.seconds:g}" if self.kind == "delay" else (f":{self.nth}" if self.nth is not None else "")
        return f"{self.kind}:{self.rank}{arg}"

    def applies(self, rank: int, nth: int) -> bool:
        return rank == self.rank and (self.nth is None or self.nth == nth)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_fault(text: str) -> Fault:
    """Parse one `KIND:RANK[:ARG]`; InputError (one line) on anything else."""
    what = f"--inject {text}"
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise InputError(what, "expected KIND:RANK[:ARG], e.g. corrupt:1, delay:2:0.5, crash:3, skip:0")
    kind, rank_text = parts[0].lower(), parts[1]
    if kind not in KINDS:
        raise InputError(what, f"unknown kind {parts[0]!r} (one of {', '.join(KINDS)})")
    try:
        rank = int(rank_text)
    except ValueError:
        raise InputError(what, f"rank {rank_text!r} is not an integer") from None
    if rank < 0:
        raise InputError(what, "rank must be >= 0")
    arg = parts[2] if len(parts) == 3 else None
    if kind == "delay":
        if arg is None:
            raise InputError(what, "delay needs SECONDS, e.g. delay:1:0.5")
        try:
            seconds = float(arg)
        except ValueError:
            raise InputError(what, f"SECONDS {arg!r} is not a number") from None
        if not (0 < seconds < 3600):
            raise InputError(what, "SECONDS must be > 0 and < 3600")
        return Fault(kind, rank, None, seconds)
    nth = None
    if arg is not None:
        try:
            nth = int(arg)
        except ValueError:
            raise InputError(what, f"N {arg!r} is not an integer (the 1-based collective to hit)") from None
        if nth < 1:
            raise InputError(what, "N must be >= 1 (the 1-based collective to hit)")
    if kind in ("crash", "skip") and nth is None:
        nth = 1
    return Fault(kind, rank, nth)


def parse_faults(texts) -> list[Fault]:
    return [parse_fault(t) for t in texts or ()]


def check_ranks(faults: list[Fault], world_size: int) -> None:
    for f in faults:
        if f.rank >= world_size:
            raise InputError(f"--inject {f}", f"rank {f.rank} does not exist in a world of {world_size}")


class FaultPlan:
    """The faults that hit this rank, applied around each collective by the worker."""

    def __init__(self, faults: list[dict] | list[Fault], rank: int):
        self.faults = [f if isinstance(f, Fault) else Fault(**f) for f in faults]
        self.rank = rank

    def _hit(self, kind: str, nth: int) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind and f.applies(self.rank, nth)), None)

    def should_skip(self, nth: int) -> bool:
        return self._hit("skip", nth) is not None

    def before(self, nth: int) -> None:
        """Called before this rank's nth collective (1-based): crash or sleep."""
        if self._hit("crash", nth):
            os._exit(CRASH_EXIT_CODE)  # no cleanup, no goodbye: like a killed process
        delay = self._hit("delay", nth)
        if delay:
            time.sleep(delay.seconds)

    def after(self, nth: int, output) -> None:
        """Called with this rank's output tensor after its nth collective: corrupt it in place."""
        if output is None or output.numel() == 0 or not self._hit("corrupt", nth):
            return
        flat = output.view(-1)
        i = flat.numel() // 2
        flat[i] = flat[i] + 1 + flat[i].abs()  # far outside any tolerance, representable in every dtype
