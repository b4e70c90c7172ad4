"""One fault-injection grammar, `KIND:RANK[:ARG][@WHEN]`, for every command that plants faults to prove a check can
fail: `validate` and `check` (around collectives), the health monitor's demo and `parity` (in training), and
`distdoctor run --inject` (into any job, at the torch.distributed boundary: recorder/inject.py).

WHEN (run only) says when the fault fires, as comma-separated `key=value`: `call=K` (the rank's K-th
torch.distributed call, or its K-th on `group=G`, a group's name or description), `after=T` (seconds after the
rank started), `step=N` (at optimizer step N, 1-based). A kind whose ARG is the N-th call (skip, crash, ...) reads
`KIND:R:K` as `KIND:R@call=K`.

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


def _code(text: str) -> int:
    try:
        code = int(text)
    except ValueError:
        raise ValueError(f"CODE {text!r} is not an integer (the exit code)") from None
    if not 0 <= code <= 255:
        raise ValueError(f"CODE must be 0..255, got {code}")
    return code


SIGNALS = ("KILL", "TERM", "SEGV", "STOP", "INT", "ABRT", "BUS")


def _signal(text: str) -> str:
    name = text.strip().upper()
    name = name[3:] if name.startswith("SIG") else name
    if name not in SIGNALS:
        raise ValueError(f"SIGNAL {text!r} is not one of {', '.join('SIG' + n for n in SIGNALS)}")
    return "SIG" + name


HANG_HOW = ("sleep", "gil")


def _hang_how(text: str) -> str:
    if text.strip().lower() not in HANG_HOW:
        raise ValueError(f"HOW {text!r} is not one of {', '.join(HANG_HOW)}")
    return text.strip().lower()


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
    # distdoctor run --inject: at the torch.distributed boundary of any job (recorder/inject.py)
    Kind("twice", "N", _nth, "the 1-based call to hit", default=1, example="twice:1:3"),
    Kind("resize", "N", _nth, "the 1-based call to hit", default=1, example="resize:1:3"),
    Kind("retype", "N", _nth, "the 1-based call to hit", default=1, example="retype:1:3"),
    Kind("reroot", "N", _nth, "the 1-based call to hit", default=1, example="reroot:1:3"),
    Kind("repeer", "N", _nth, "the 1-based call to hit", default=1, example="repeer:1:3"),
    Kind("raise", "N", _nth, "the 1-based call to hit", default=1, example="raise:1:3"),
    Kind("exit", "CODE", _code, "the exit code", default=1, example="exit:1:3@call=5"),
    Kind("kill", "SIGNAL", _signal, "the signal it sends itself", default="SIGKILL", example="kill:1:SIGTERM@step=3"),
    Kind("hang", "HOW", _hang_how, "sleep (forever) or gil (hold the GIL forever)", default="sleep",
         example="hang:1@step=3"),
    Kind("endthread", "NAME", _name, "a thread's name", required=True, example="endthread:1:loader@after=5"),
)}
# What each command can plant.
VALIDATE_KINDS = ("corrupt", "delay", "crash", "skip")
HEALTH_KINDS = ("drift", "nan", "slow", "mem")
PARITY_KINDS = ("drift",)
RUN_KINDS = ("skip", "twice", "resize", "retype", "reroot", "repeer", "raise", "crash", "exit", "kill", "hang",
             "delay", "endthread")
_USED_BY = {**{k: "distdoctor run" for k in RUN_KINDS},
            **{k: "validate, check and distdoctor run" for k in VALIDATE_KINDS if k in RUN_KINDS},
            **{k: "validate and check" for k in VALIDATE_KINDS if k not in RUN_KINDS},
            **{k: "the health monitor" for k in HEALTH_KINDS}, "drift": "the health monitor and parity"}
WHEN_KEYS = ("call", "group", "after", "step")


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    arg: Any = None  # parsed ARG: int N, float SECONDS/MIB/AMOUNT, str LAYER/PARAM; None = every call (corrupt)
    when: tuple = ()  # (key, value) pairs of @WHEN, in WHEN_KEYS order (run only)

    def __str__(self) -> str:
        text = f"{self.kind}:{self.rank}" + (f":{self.arg:g}" if isinstance(self.arg, float) else
                                             f":{self.arg}" if self.arg is not None else "")
        return text + ("@" + ",".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.when)
                       if self.when else "")

    def applies(self, rank: int, nth: int) -> bool:
        """validate: whether this fault hits `rank`'s nth collective (an N-less fault hits every one)."""
        return rank == self.rank and (not isinstance(self.arg, int) or self.arg == nth)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["when"]
        if self.when:
            out["when"] = dict(self.when)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Fault":
        when = d.get("when") or {}
        return cls(d["kind"], int(d["rank"]), d.get("arg"), tuple((k, when[k]) for k in WHEN_KEYS if k in when))


def _parse_when(text: str, what: str) -> tuple:
    """`call=K,group=G,after=T,step=N` -> (key, value) pairs in WHEN_KEYS order."""
    got: dict = {}
    for item in text.split(","):
        key, eq, value = item.partition("=")
        key = key.strip().lower()
        if not eq or key not in WHEN_KEYS:
            raise InputError(what, f"WHEN {item!r} is not one of call=K, group=G, after=SECONDS, step=N")
        if key in got:
            raise InputError(what, f"WHEN gives {key} twice")
        try:
            got[key] = (_nth(value) if key in ("call", "step") else _name(value) if key == "group"
                        else _positive("after", 10 ** 7)(value))
        except ValueError as exc:
            raise InputError(what, f"{key}: {exc}") from None
    if "group" in got and "call" not in got:
        raise InputError(what, "group=G counts calls: give call=K with it")
    return tuple((k, got[k]) for k in WHEN_KEYS if k in got)


def parse_fault(text: str, kinds: tuple[str, ...] = VALIDATE_KINDS, world_size: int | None = None) -> Fault:
    """Parse one `KIND:RANK[:ARG][@WHEN]` for a command that plants `kinds` (@WHEN only where `kinds` is
    RUN_KINDS); InputError (one line) on anything else."""
    what = f"--inject {text}"
    text, at, when_text = text.strip().partition("@")
    when = ()
    if at:
        if kinds != RUN_KINDS:
            raise InputError(what, "@WHEN is read only by distdoctor run --inject")
        when = _parse_when(when_text, what)
    parts = text.split(":")
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
        return _at_call(Fault(name, rank, kind.default, when), what, explicit=False)
    try:
        fault = Fault(name, rank, kind.parse(parts[2]), when)
    except ValueError as exc:
        raise InputError(what, f"{kind.arg}: {exc}" if not str(exc).startswith(kind.arg) else str(exc)) from None
    return _at_call(fault, what, explicit=True)


def _at_call(fault: Fault, what: str, explicit: bool) -> Fault:
    """With @WHEN, a kind whose ARG is the N-th call fires where WHEN says: `KIND:R:K` is `KIND:R@call=K`, and
    giving both is refused."""
    if not fault.when or KINDS[fault.kind].arg != "N":
        return fault
    if explicit:
        raise InputError(what, f"give the call once: either {fault.kind}:{fault.rank}:N or @call=N")
    return Fault(fault.kind, fault.rank, None, fault.when)


def parse_faults(texts, kinds: tuple[str, ...] = VALIDATE_KINDS, world_size: int | None = None) -> list[Fault]:
    return [parse_fault(t, kinds, world_size) for t in texts or ()]
