"""Members a call cannot be proven absent from: a recorder-only rank beside Flight Recorder ranks does not see
the calls issued from C++ (`RankTrace.unseen`, trace/loaders/align_ranks.py). Its trace ending before such a
call is no proof it never came: neither present nor absent, unless it is the one member a call nobody
completed can wait for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distdoctor.trace.model import Entry

if TYPE_CHECKING:  # (a type only: match.py imports this module)
    from distdoctor.diagnose.match import GroupView


def absent_from(view: GroupView, seq: int, present: dict[int, Entry], behind: list[int]) -> list[int]:
    """Of the members whose trace ends before collective `seq` (`behind`), those that never issued it."""
    unseen = [r for r in behind if seq in view.unseen.get(r, ())]
    if not unseen:
        return behind
    absent = [r for r in behind if r not in unseen]
    if not absent and _only_one_can_be_missing(view, present, unseen):
        return unseen
    return absent


def _only_one_can_be_missing(view: GroupView, present: dict[int, Entry], unseen: list[int]) -> bool:
    """Every member left a trace, all but one hold the call, nobody completed it: the one member whose trace
    cannot see it is the one it waits for (had it come, the call would have completed)."""
    return len(unseen) == 1 and set(view.members) <= set(view.by_rank) and \
        len(present) + 1 >= len(view.members) and not any(view.is_done(r, e) for r, e in present.items())
