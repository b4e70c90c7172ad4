"""Library code or the user's: told by where the modules were loaded from, never by a name anywhere in the path.

A frame is library code when its file belongs to torch, to distdoctor's wrappers around torch's calls (its
`recorder` and `trace` packages; its other stages issue collectives as any program does) or to Python's standard library
(with typing_extensions and the frozen import machinery): the plumbing a call passes through on its way from the
user's line. Everything else is the user's, wherever it lives: a script in a folder named `distdoctor` or `torch`
is the user's own. One rule, read by diagnose (call sites, where a rank is), lint (conditional call sites), sim
(`from-trace` call sites) and the recorder (which frames it keeps per call).

A file is recognised as a package's in one of two ways:
- on this machine: it lies under the directory the package was loaded from (found without importing it);
- recorded elsewhere (a dump from another host or install prefix): its path goes through a folder of the package's
  name, and what follows that folder names the package as installed here — a file of it, or a file inside one of
  its subpackages (`…/torch/distributed/distributed_c10d.py`, `…/distdoctor/recorder/patch.py`) — or that folder
  sits directly in `site-packages`/`dist-packages`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sysconfig

PACKAGES = ("torch", "distdoctor")
_DISTDOCTOR_PLUMBING = frozenset({"recorder", "trace"})
_INSTALL_DIRS = ("site-packages", "dist-packages")
# The standard library wherever the job's interpreter lived (/usr/lib/python3.11/, a conda's lib/python3.10/), but
# not the packages installed beside it.
_STDLIB = re.compile(r"[/\\]lib(?:64)?[/\\]python3[.\d]*[/\\](?!(?:site|dist)-packages[/\\])")
_PLUMBING = ("<frozen ", "typing_extensions.py")
# The standard library's call plumbing by name too, for a dump whose interpreter lay where _STDLIB does not see it.
_PLUMBING_FILES = frozenset({"threading.py", "runpy.py", "contextlib.py", "functools.py"})


@functools.cache
def package_dir(name: str) -> str | None:
    """The directory package `name` is loaded from here, without importing it (None where it is not installed)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec is not None else None
    return os.path.dirname(os.path.realpath(origin)) if origin else None


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib") if paths.get(k)})


def _names_package_file(name: str, rest: list[str]) -> bool:
    """Whether `rest` (path parts after a folder named `name`) is a file of that package as installed here."""
    root = package_dir(name)
    if root is None or not rest:
        return False
    if os.path.isfile(os.path.join(root, *rest)):
        return True
    return len(rest) > 1 and os.path.isfile(os.path.join(root, rest[0], "__init__.py"))


@functools.lru_cache(maxsize=16384)
def locate(filename: str) -> tuple[str, tuple[str, ...]] | None:
    """(package, path parts inside it) when the file is torch's or distdoctor's code (here or as recorded
    elsewhere), else None."""
    real = filename if filename.startswith("<") else os.path.realpath(filename)
    for name in PACKAGES:
        root = package_dir(name)
        for path in (real, filename):
            if root and path.startswith(root + os.sep):
                return name, tuple(re.split(r"[/\\]", path[len(root) + 1:]))
    parts = re.split(r"[/\\]", filename)
    for i in range(len(parts) - 2, -1, -1):  # the innermost folder of the name: /work/distdoctor/src/distdoctor/…
        name, rest = parts[i], parts[i + 1:]
        if name in PACKAGES and ((i and parts[i - 1] in _INSTALL_DIRS) or _names_package_file(name, rest)):
            return name, tuple(rest)
    return None


def is_torch(filename: str) -> bool:
    got = locate(filename)
    return got is not None and got[0] == "torch"


def _is_plumbing_package(filename: str) -> bool:
    """Torch's code, or the part of distdoctor that stands between the user's call and torch's (the recorder's
    wrappers; `trace` held them before, and dumps recorded then still show that path). distdoctor's other stages
    are the program when they issue collectives themselves (validate's checks, bench's sweeps): their lines are
    the ones to name."""
    got = locate(filename)
    return got is not None and (got[0] == "torch" or got[1][0] in _DISTDOCTOR_PLUMBING)


@functools.lru_cache(maxsize=16384)
def is_library(filename: str) -> bool:
    """Torch's, distdoctor's recorder's, the standard library's or import plumbing: not a line the user wrote."""
    if any(m in filename for m in _PLUMBING) or re.split(r"[/\\]", filename)[-1] in _PLUMBING_FILES:
        return True
    if _is_plumbing_package(filename):
        return True
    if _STDLIB.search(filename) is not None:
        return True
    real = os.path.realpath(filename) if not filename.startswith("<") else filename
    return any(real.startswith(d) and not real[len(d):].startswith(_INSTALL_DIRS) for d in _stdlib_dirs())


def is_user_code(filename: str) -> bool:
    return not is_library(filename)
