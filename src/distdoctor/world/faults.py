"""One fault-injection grammar, `KIND:RANK[:ARG]`, for every command that plants faults to prove a check can fail:
`validate` and `check` (around collectives), the health monitor's demo and `parity` (in training).

Each kind gives ARG one meaning (KINDS; the table of kinds is in docs/validate.md, "Fault injection"). `drift`'s
ARG is the parameter that drifts; parity's older spelling `drift:RANK:AMOUNT` (a number where PARAM goes, e.g.
`drift:1:1e-9`) is still read, the number being the amount the first parameter moves by. Every error is one line
naming the `--inject` text and the reason. Faults are plain data (JSON-able): they travel to workers in a job's
arguments, and each command plants them its own way (validate/execute.py, health/inject.py, health/parity.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from distdoctor.errors import InputError

CRASH_EXIT_CODE = 17


def _nth(text: str) -> int:
    try:
        nth = int(text)
    except ValueError:
        raise ValueError(f"N {text!r} is not an integer (the 1-based collective to hit)") from None
    if nth < 1:
        raise ValueError("N must be >= 1 (the 1-based collective to hit)")
    return nth


def _positive(name: str, upper: float | None = None) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name} {text!r} is not a number") from None
        if not (value > 0 and (upper is None or value < upper)):
            bound = f", < {upper:g}" if upper is not None else ""
            raise ValueError(f"{name} must be a positive number (> 0{bound}), got {text!r}")
        return value
    return parse


def _name(text: str) -> str:
    if not text.strip():
        raise ValueError("the name is empty")
    return text


def _param_or_amount(text: str) -> str | float:
    """drift's PARAM; a number there is the amount of parity's older spelling `drift:RANK:AMOUNT`."""
    try:
        return float(text)
    except ValueError:
        return _name(text)


@dataclass(frozen=True)
class Kind:
    name: str
    arg: str  # what ARG is called in messages and docs
    parse: Callable[[str], Any]  # ARG text -> value; ValueError(reason) when it is not one
    means: str  # ARG in words
    default: Any = None  # the value when ARG is left out
    required: bool = False
    example: str = ""


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("corrupt", "N", _nth, "the 1-based collective to hit", example="corrupt:1"),
    Kind("delay", "SECONDS", _positive("SECONDS", 3600), "seconds of sleep", required=True, example="delay:1:0.5"),
    Kind("crash", "N", _nth, "the 1-based collective to hit", default=1, example="crash:3"),
    Kind("skip", "N", _nth, "the 1-based collective to hit", default=1, example="skip:0"),
    Kind("drift", "PARAM", _param_or_amount, "a parameter name", example="drift:2:fc2.weight"),
    Kind("nan", "LAYER", _name, "a layer name", required=True, example="nan:1:fc2"),
    Kind("slow", "SECONDS", _positive("SECONDS"), "seconds of sleep", default=0.05, example="slow:1:0.05"),
    Kind("mem", "MIB", _positive("MIB"), "MiB to hold", default=512.0, example="mem:0:512"),
)}
# What each command can plant.
VALIDATE_KINDS = ("corrupt", "delay", "crash", "skip")
HEALTH_KINDS = ("drift", "nan", "slow", "mem")
PARITY_KINDS = ("drift",)
_USED_BY = {**{k: "validate and check" for k in VALIDATE_KINDS}, **{k: "the health monitor" for k in HEALTH_KINDS},
            "drift": "the health monitor and parity"}


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    arg: Any = None  # parsed ARG: int N, float SECONDS/MIB/AMOUNT, str LAYER/PARAM; None = every call (corrupt)

    def __str__(self) -> str:
        return f"{self.kind}:{self.rank}" + (f":{self.arg:g}" if isinstance(self.arg, float) else
                                             f":{self.arg}" if self.arg is not None else "")

    def applies(self, rank: int, nth: int) -> bool:
        """validate: whether this fault hits `rank`'s nth collective (an N-less fault hits every one)."""
        return rank == self.rank and (not isinstance(self.arg, int) or self.arg == nth)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_fault(text: str, kinds: tuple[str, ...] = VALIDATE_KINDS, world_size: int | None = None) -> Fault:
    """Parse one `KIND:RANK[:ARG]` for a command that plants `kinds`; InputError (one line) on anything else."""
    what = f"--inject {text}"
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        examples = ", ".join(KINDS[k].example for k in kinds)
        raise InputError(what, f"expected KIND:RANK[:ARG], e.g. {examples}")
    name, rank_text = parts[0].lower(), parts[1]
    if name not in kinds:
        elsewhere = f"; {name} is planted by {_USED_BY[name]}" if name in _USED_BY else ""
        raise InputError(what, f"unknown kind {parts[0]!r} here (one of {', '.join(kinds)}){elsewhere}")
    kind = KINDS[name]
    try:
        rank = int(rank_text)
    except ValueError:
        raise InputError(what, f"RANK {rank_text!r} is not an integer") from None
    if rank < 0:
        raise InputError(what, "RANK must be >= 0")
    if world_size is not None and rank >= world_size:
        raise InputError(what, f"rank {rank} does not exist in a world of {world_size}")
    if len(parts) == 2:
        if kind.required:
            raise InputError(what, f"{name} needs {kind.arg} ({kind.means}), e.g. {kind.example}")
        return Fault(name, rank, kind.default)
    try:
        return Fault(name, rank, kind.parse(parts[2]))
    except ValueError as exc:
        raise InputError(what, f"{kind.arg}: {exc}" if not str(exc).startswith(kind.arg) else str(exc)) from None


def parse_faults(texts, kinds: tuple[str, ...] = VALIDATE_KINDS, world_size: int | None = None) -> list[Fault]:
    return [parse_fault(t, kinds, world_size) for t in texts or ()]
