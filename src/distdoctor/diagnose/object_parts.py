"""A rank that died unpacking an object collective's bytes after skipping one of its parts (`skipped_part`).

torch's object collectives run in parts: broadcast_object_list broadcasts the objects' sizes, then their bytes;
all_gather_object gathers sizes, then the padded pickles. A rank that skips a part (a rank-conditional branch, a
drill's `skip`) reads a buffer the part never filled: it sizes a 140 TB buffer from garbage, or unpickles zeros,
and dies there, before the next part - which its peers issued from the very line it died at, and wait in. The
same death follows a peer's wrong root or size (crash.unpacked_findings: "one of" the members), but then a part
the rank completed went wrong for some member: where every member completed each of the statement's earlier
parts alike (same collective, sizes, dtypes, and a root every member recorded), nothing went wrong before the
part the rank never issued, and it is the one that skipped it (fuzz runs 75-67, 75-72: `objects`, skip).
"""

from __future__ import annotations

from distdoctor.collectives import SPECS
from distdoctor.diagnose.sites import user_chain
from distdoctor.trace.model import Entry, TraceSet

PARTS = 4  # the rank's last calls on the group before the part it skipped that every member must agree on


def skipped_part(ts: TraceSet, rank: int, died_at: str | None, group: str) -> Entry | None:
    """The call of `group` every other member issued next from the line `rank` died at (`died_at`, its innermost
    user frame; a trace that records no line does not object), which `rank` never issued, when every member
    completed each of its last PARTS calls there alike (see above); else None."""
    info = ts.ranks[rank].groups.get(group)
    if died_at is None or info is None or any(m not in ts.ranks for m in info.ranks) or len(info.ranks) < 2:
        return None
    calls = {m: _calls(ts, m, group) for m in info.ranks}
    last = max(calls[rank], default=0)
    others = [m for m in info.ranks if m != rank]
    nxt = [calls[m].get(last + 1) for m in others]
    if any(e is None or _user_line(e) not in (None, died_at) for e in nxt):
        return None  # a peer's next call from another line (Flight Recorder's dumps hold no line: no objection)
    for seq in range(max(1, last - PARTS + 1), last + 1):
        if not _alike([calls[m].get(seq) for m in info.ranks]):
            return None
    return nxt[0]


def _calls(ts: TraceSet, rank: int, group: str) -> dict[int, Entry]:
    return {e.seq: e for e in ts.ranks[rank].entries if e.group == group and e.seq is not None and not e.is_p2p}


def _alike(calls: list[Entry | None]) -> bool:
    """Every member completed the call, as one collective with one size, dtype and root (recorded by all)."""
    if any(e is None or e.state != "completed" for e in calls):
        return False
    spec = SPECS.get(calls[0].op)
    if spec is not None and spec.rooted and any(e.root is None for e in calls):
        return False  # a root some trace does not record (Flight Recorder's) may be the one that differed
    return len({(e.op, repr(e.in_sizes), repr(e.in_dtypes), e.root) for e in calls}) == 1


def _user_line(e: Entry) -> str | None:
    """The innermost frame of the user's code a call was issued from."""
    chain = user_chain(e.frames or [])
    return str(chain[0]) if chain else None
