"""Where each rank's files go in the dump directory: flat, or one subdirectory per host.

flat (the default):  DUMP_DIR/rank_<r>.jsonl, rank_<r>.fr.pkl, .rank_<r>.pid
host:                DUMP_DIR/host-<hostname>/rank_<r>.jsonl, ...   (`distdoctor run --dump-layout host`)

On a shared file system (Lustre, GPFS, NFS) every create and rename in one directory takes that directory's
lock on the metadata server, so 16 384 ranks dumping at once into one directory queue behind each other, and
listing it is slow; one directory per host spreads that over 2 048 directories of 8 files. `--dump-layout auto`
chooses host from AUTO_HOST_RANKS ranks up. The rank number stays in the file name, so the layout never carries
meaning: readers (`distdoctor run`'s watcher, `diagnose DIR`) look in both places. The request file that
`distdoctor run` writes for a hang episode stays at the top.
"""

from __future__ import annotations

import glob
import os
import re

LAYOUTS = ("flat", "host", "auto")
HOST_PREFIX = "host-"
AUTO_HOST_RANKS = 1024  # `auto`: one directory per host from this many ranks up
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def resolve(layout: str | None, world_size: int | None) -> str:
    """flat or host, for a layout setting (None: flat) and the job's world size (None: unknown)."""
    if layout == "host":
        return "host"
    if layout == "auto" and world_size is not None and world_size >= AUTO_HOST_RANKS:
        return "host"
    return "flat"


def host_dir_name(host: str) -> str:
    """`host-<name>`, the name made safe for a path (a host name never holds a slash, but be sure)."""
    return HOST_PREFIX + (_UNSAFE.sub("_", host) or "unknown")


def rank_dir(dump_dir: str, layout: str, host: str) -> str:
    """The directory this rank writes into under `layout` (already resolved: flat or host)."""
    return os.path.join(dump_dir, host_dir_name(host)) if layout == "host" else dump_dir


def find(dump_dir: str, pattern: str) -> list[str]:
    """Files matching `pattern` (a glob such as `rank_*.jsonl`) in either layout."""
    return (glob.glob(os.path.join(glob.escape(dump_dir), pattern))
            + glob.glob(os.path.join(glob.escape(dump_dir), HOST_PREFIX + "*", pattern)))


def host_dirs(dump_dir: str) -> list[str]:
    """The per-host subdirectories of `dump_dir`."""
    return sorted(p for p in glob.glob(os.path.join(glob.escape(dump_dir), HOST_PREFIX + "*")) if os.path.isdir(p))
