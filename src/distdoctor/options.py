"""The option types every command declares its numbers, sizes, counts and input paths with, so that each is
checked once, the same way, before any work starts: a number is finite and in range and its message names the
unit; a count has a cap; an input file is a regular file below a stated size, refused with the reason before a
byte of it is read (a FIFO, a device, a symbolic-link loop, a directory, a file too large).

A bad value raises InputError naming the option (or the path) and the reason: the CLI prints it as one line and
exits 2. Nothing here imports torch.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat

import click

from distdoctor.errors import InputError

MiB = 1 << 20
GiB = 1 << 30
SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(i?B)?\s*$", re.IGNORECASE)
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else f"{x:,}".replace(",", " ")


class Number(click.ParamType):
    """A finite number (float, or int with integer=True) in [low, high] (low excluded with low_open), in `unit`."""

    name = "number"

    def __init__(self, unit: str, low: float | None = None, high: float | None = None, low_open: bool = False,
                 integer: bool = False, phrase: str = ""):
        self.unit, self.low, self.high, self.low_open, self.integer = unit, low, high, low_open, integer
        self.name = "integer" if integer else "number"
        self.phrase = phrase  # what a value must be, when the range alone does not say it ("a TCP port (1-65535)")

    def _range(self) -> str:
        if self.phrase:
            return self.phrase
        if self.low == 0 and self.low_open:
            head = f"a positive number of {self.unit}"
        elif self.low is not None:
            head = f"{'>' if self.low_open else '>='} {_fmt(self.low)} {self.unit}"
        else:
            head = f"a number of {self.unit}"
        return head + (f" up to {_fmt(self.high)}" if self.high is not None else "")

    def convert(self, value, param, ctx):
        what = option_name(param)
        text = str(value).strip()
        try:
            number = int(text, 10) if self.integer else float(text)
        except ValueError:
            kind = "a whole number" if self.integer else "a number"
            raise InputError(what, f"must be {kind} of {self.unit}, got {text!r}") from None
        if not math.isfinite(number):
            raise InputError(what, f"must be a finite number of {self.unit}, got {text!r}")
        low_bad = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        if low_bad or (self.high is not None and number > self.high):
            raise InputError(what, f"must be {self._range()}, got {text}")
        return number


def option_name(param) -> str:
    """How a message names an option: '-n/--iters', '--timeout', or an argument's name."""
    if param is None:
        return "value"
    if isinstance(param, click.Argument):
        return param.human_readable_name
    return "/".join(param.opts) if param.opts else str(param.name)


def seconds(low: float = 0.0, high: float = 7 * 86400.0, low_open: bool = False) -> Number:
    """Seconds; the default cap is one week (a longer wait is a typo, and timedelta(inf) overflows)."""
    return Number("seconds", low, high, low_open)


def microseconds(low: float = 0.0, high: float = 1e12) -> Number:
    return Number("µs", low, high)


def count(unit: str, low: int = 0, cap: int = 1_000_000) -> Number:
    """A whole number of `unit` from low to cap: every count a user can type has a cap."""
    return Number(unit, low, cap, integer=True)


SEED = Number("seed", 0, (1 << 63) - 1, integer=True)
PORT = Number("port", 1, 65535, integer=True, phrase="a TCP port (1-65535)")


def parse_size(text: str, what: str, force_bytes: bool = False) -> tuple[int, bool]:
    """'1023' (elements), '1M' (2^20 elements), '1MiB'/'1MB'/'4096B' (bytes): (value, is_bytes).
    force_bytes: a plain number is bytes. Raises InputError naming `what`."""
    if text.strip().startswith("-"):
        raise InputError(what, f"size {text.strip()!r} is negative")
    m = SIZE_RE.match(text)
    if not m:
        raise InputError(what, f"size {text.strip()!r} is not a number with an optional K/M/G or B/KiB/MiB suffix")
    return int(m.group(1)) * SIZE_UNITS[m.group(2).upper()], force_bytes or bool(m.group(3))


class ByteSize(click.ParamType):
    """A size in bytes with an optional K/M/G (2^10/2^20/2^30) or KiB/MiB/GiB suffix, from low to cap."""

    name = "size"

    def __init__(self, low: int = 0, cap: int = 1 << 50):
        self.low, self.cap = low, cap

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            n, _ = parse_size(str(value), what=option_name(param), force_bytes=True)
        if not self.low <= n <= self.cap:
            raise InputError(option_name(param), f"must be from {human_bytes(self.low)} to {human_bytes(self.cap)}, "
                                                 f"got {value} ({n} bytes)")
        return n


def human_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{int(n)} B"


# ---------------------------------------------------------------------------------------------- paths
_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe), which waits for a writer"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def path_status(path: str) -> os.stat_result:
    """os.stat(path), or InputError with the true reason: no such file, a dangling link, a link loop, no access."""
    try:
        return os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(path, "a symbolic link loop (it resolves to itself)") from None
        if exc.errno == errno.ENOENT and os.path.islink(path):
            raise InputError(path, f"a dangling symbolic link (to {os.readlink(path)!r}, which does not exist)") \
                from None
        if exc.errno == errno.ENOENT:
            raise InputError(path, "no such file or directory") from None
        raise InputError(path, f"cannot be read ({exc.strerror or exc})") from None


def kind_of(st: os.stat_result) -> str | None:
    """What a path is when it is not a regular file (a directory, a FIFO, a device, a socket), else None."""
    return next((what for test, what in _KINDS if test(st.st_mode)), None)


def check_input_file(path: str, max_bytes: int, what: str = "") -> int:
    """A regular file below max_bytes, readable: its size; else InputError with the reason, nothing read."""
    st = path_status(path)
    kind = kind_of(st)
    if kind is not None:
        raise InputError(path, f"is {kind}; {what or 'this input'} must be a regular file")
    if st.st_size > max_bytes:
        raise InputError(path, f"is {human_bytes(st.st_size)}, above the {human_bytes(max_bytes)} limit for "
                               f"{what or 'this input'}")
    if not os.access(path, os.R_OK):
        raise InputError(path, "cannot be read (permission denied)")
    return st.st_size


def check_directory(path: str, what: str = "") -> None:
    """An existing, readable directory; else InputError with the reason."""
    st = path_status(path)
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(path, f"is {kind_of(st) or 'a regular file'}; {what or 'this input'} must be a directory")
    if not os.access(path, os.R_OK | os.X_OK):
        raise InputError(path, "cannot be read (permission denied)")


class InputFile(click.ParamType):
    """A path option or argument naming a regular file below max_bytes (checked, never read here)."""

    name = "file"

    def __init__(self, max_bytes: int, what: str):
        self.max_bytes, self.what = max_bytes, what

    def convert(self, value, param, ctx):
        check_input_file(str(value), self.max_bytes, self.what)
        return str(value)


SNIFF_BYTES = 64 << 10


def check_input_path(path: str, max_file_bytes: int, what: str) -> bool:
    """A directory (True) or a regular file below max_file_bytes whose head is not all NUL bytes (False); else
    InputError with the reason. Of a file only the first SNIFF_BYTES are read: a sparse or zero-filled file is
    refused for what it is, before a reader spends its whole length finding no format in it."""
    st = path_status(path)
    if stat.S_ISDIR(st.st_mode):
        check_directory(path, what)
        return True
    kind = kind_of(st)
    if kind is not None:
        raise InputError(path, f"is {kind}; {what} must be a regular file")
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        raise InputError(path, f"cannot be read ({exc.strerror or exc})") from None
    if head and not head.strip(b"\0"):
        sparse = " (a sparse file: almost nothing of it is stored)" if st.st_blocks * 512 < st.st_size // 8 else ""
        raise InputError(path, f"its first {human_bytes(len(head))} are all NUL bytes{sparse}: not {what}")
    check_input_file(path, max_file_bytes, what)
    return False
