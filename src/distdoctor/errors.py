"""Errors a user can fix. The CLI prints them as one line (never a traceback) and exits 2.

Raise InputError(what, why): `what` names the input (a file, a flag, a rank/stream/op position),
`why` says what is wrong with it.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input: the message names the input and the reason."""

    def __init__(self, what: str, why: str):
        self.what = what
        self.why = why
        super().__init__(f"{what}: {why}")


class CheckFailed(Exception):
    """What was checked failed; the report is already printed. Carries the exit code."""

    def __init__(self, code: int = 1):
        self.code = code
        super().__init__(code)
