"""Per-rank text logs as a trace source: begin/end markers around each op, per thread, and NCCL_DEBUG=INFO calls.

Hangs are often explained by hand from logs: a `before: <op>` / `after: <op>` line around every kernel launch, per
thread, and the op with a `before` and no `after` on a thread is where that thread (stream) is stuck. This reads
such logs into the trace model: each thread's state goes to `RankTrace.log` (diagnose/threads.py compares ranks),
NCCL's collective calls become ordinary entries (nccl_log.py), so the collective analysis applies to them.

Formats (detected by content, like every trace source):
- markers, by default glog lines with a thread-id column, as OneFlow's kernels log them:
  `I20220419 11:42:17.453923 2726812 kernel.cpp:51] before: System-Src-WaitAndSendIds_1157` and `... after: <op>`;
  any other format with `--begin REGEX` / `--end REGEX` (named group `op`, and `thread` where the line has one;
  each is searched in every line; without `thread` the rank has one thread, "main");
- NCCL_DEBUG=INFO lines of collective calls (nccl_log.py).

The rank: `--log-rank REGEX` (named group `rank`) searched in the file's path; else `rank_<r>`, `rank<r>` or
`rank-<r>` in the file name or the nearest folder that has one (`rank3/oneflow.INFO`); else the rank NCCL's
largest communicator gives the process.

Pairing, per thread: `after X` closes the open `X` (ops are paired by name, so an end never closes another op).
A `before X` while an earlier `X` is still open on the thread supersedes it: the earlier begin's end was never
logged (markers around kernel launches do not nest; the line was lost, or the op re-entered) and it is counted as
`unclosed`, not as a run. An end with no open begin is counted as `unmatched_ends`: when it comes before any begin of
its op on the thread, the log started inside that op (a run before the log); otherwise its begin line was lost or
unreadable (a run, finished). So the seed's `before X / after X / before X` is X's second run,
open; `before X / before X / after X` is one finished run and one unclosed begin. The thread's open op is the latest
begun op still open; the others still open are listed as `also_open` (an outer op, for markers that nest).
Counts come from per-(thread, op) totals and the first and last line of each: exact for well-formed logs.

Bad lines are counted, never fatal: a line with a marker keyword that the marker pattern does not read (a broken
prefix), or whose op name is empty or not printable text (bad bytes); likewise NCCL lines. They are skipped.

Speed: the patterns are compiled once; a file is read in binary; the default markers are matched over its bytes
(custom ones over text decoded at C speed, bad bytes kept as surrogates) by one `findall`, which also catches the
unreadable marker lines; they are counted per distinct line in C, and only the lines the report cites are located,
scanning back from the end of the file. Only per-thread state and per-op run counts are kept. Many files load in
the loader's worker processes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from distdoctor.trace.loaders.nccl_log import link_nccl, read_nccl
from distdoctor.trace.model import LoadError, RankLog, RankTrace, ThreadState

SKIPPED_EXAMPLES = 5  # file:line of the first few skipped lines, per rank

# Bytes: a regex runs about a third faster over bytes than over str. One group per line (a bytes object is cheaper
# to build, count and hash than a tuple), split per distinct value; the second branch catches the marker lines the
# first cannot read (a broken prefix) as an empty value, so bad lines are counted in the same pass.
_GLOG_MARKER = rb"^(?:[IWEF]\S* \S+ +(\w+ \S*\] (?:before|after): .*)|.*\] (?:before|after): )"
_GLOG_PARTS = re.compile(r"(\w+) \S*\] (before|after): (.*)", re.ASCII)  # thread, kind, op: \S as the bytes
_GLOG_LINE = re.compile(rb"(?m)^[IWEF]\d{4}(?:\d{4})? \d\d:\d\d:\d\d\.\d+ +\w+ [^\]\n]*\] ")
_GLOG_TIME = re.compile(r"[IWEF](\d{4})?(\d\d)(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?) ")
_NCCL_LINE = re.compile(rb"\S+:\d+:\d+ \[\d+\] NCCL (?:INFO|WARN) ")
_RANK_IN_NAME = re.compile(r"(?<![A-Za-z0-9])(?<!local_)(?<!local-)rank[_-]?(\d+)(?!\d)", re.IGNORECASE)


@dataclass(frozen=True)
class LogFormat:
    """How to read markers and ranks: None = the defaults (glog `before:`/`after:`, rank from the path)."""
    begin: str | None = None
    end: str | None = None
    rank: str | None = None

    def __post_init__(self) -> None:
        """Raise ValueError naming the option and the reason when a pattern cannot be used."""
        if (self.begin is None) != (self.end is None):
            raise ValueError("--begin/--end: give both (an op is paired by its begin and its end)")
        for flag, pattern, groups in (("--begin", self.begin, ("op",)), ("--end", self.end, ("op",)),
                                      ("--log-rank", self.rank, ("rank",))):
            if pattern is None:
                continue
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{flag}: not a regular expression ({exc})") from None
            missing = [g for g in groups if g not in compiled.groupindex]
            if missing:
                raise ValueError(f"{flag}: needs a named group (?P<{missing[0]}>...)")
            if flag != "--log-rank" and compiled.search(""):
                raise ValueError(f"{flag}: matches an empty line, so it would match every line")
        if self.begin is not None and ("thread" in re.compile(self.begin).groupindex) != \
                ("thread" in re.compile(self.end).groupindex):
            raise ValueError("--begin/--end: either both have a (?P<thread>...) group or neither")
        if self.begin is not None:
            try:
                _Markers(self)  # the two joined into one pattern (inline flags, say, must come first)
            except re.error as exc:
                raise ValueError(f"--begin/--end: cannot be used together ({exc})") from None


_FORMAT = LogFormat()


def current_format() -> LogFormat:
    return _FORMAT


@contextlib.contextmanager
def using_format(fmt: LogFormat):
    """Read logs with `fmt` inside the block. A module setting rather than a loader argument: the loader's worker
    processes are forked inside the block and inherit it."""
    global _FORMAT
    saved, _FORMAT = _FORMAT, fmt
    try:
        yield fmt
    finally:
        _FORMAT = saved


class _Markers:
    """A compiled marker pattern over a log's bytes (default glog) or text (--begin/--end): `findall` gives one
    hashable value per marker line (equal lines, equal values; a falsy one for an unreadable line), `parts` turns a
    value into (thread, kind, op) with kind "before" or "after", or None when it cannot be read."""

    def __init__(self, fmt: LogFormat) -> None:
        self.custom = fmt.begin is not None
        self.nl = "\n" if self.custom else b"\n"
        if not self.custom:
            self.pattern = re.compile(_GLOG_MARKER, re.M)
            return
        # One alternation keeps begins and ends in file order; the end's group names are renamed apart.
        end = fmt.end.replace("(?P<op>", "(?P<_end_op>").replace("(?P<thread>", "(?P<_end_thread>")
        self.pattern = re.compile(rf"^[^\n]*?(?:(?P<_begin>{fmt.begin})|(?P<_end>{end}))", re.M)
        index = self.pattern.groupindex
        self._at = (index["_begin"] - 1, index["op"] - 1, index["_end_op"] - 1,
                    index["thread"] - 1 if "thread" in index else None,
                    index["_end_thread"] - 1 if "_end_thread" in index else None)

    def buffer(self, data: bytes):
        """What the pattern reads: the bytes themselves, or the text (bad bytes kept as surrogates)."""
        return data.decode("utf-8", "surrogateescape") if self.custom else data

    def findall(self, buf, start: int = 0, end: int | None = None) -> list:
        return self.pattern.findall(buf, start, len(buf) if end is None else end)

    def parts(self, value) -> tuple[str, str, str] | None:
        if not self.custom:
            try:
                m = _GLOG_PARTS.match(value.decode("utf-8")) if value else None
                return m.groups() if m else None
            except UnicodeDecodeError:
                return None
        b, op, end_op, th, end_th = self._at
        if value[b]:
            return value[th] if th is not None else "main", "before", value[op]
        return value[end_th] if end_th is not None else "main", "after", value[end_op]

    def starts(self, buf, start: int, end: int) -> list[int]:
        return [m.start() for m in self.pattern.finditer(buf, start, end)]


@functools.lru_cache(maxsize=8)
def _markers(fmt: LogFormat) -> _Markers:
    return _Markers(fmt)


def rank_of(path: str, fmt: LogFormat | None = None) -> int | None:
    """The rank a log's path names: --log-rank's group `rank`, else `rank<r>` in the file name or a folder."""
    fmt = fmt or _FORMAT
    if fmt.rank is not None:
        m = re.search(fmt.rank, path)
        if m and m.group("rank") is not None and m.group("rank").strip().isdigit():
            return int(m.group("rank"))
    for part in reversed(path.split(os.sep)):
        m = _RANK_IN_NAME.search(part)
        if m:
            return int(m.group(1))
    return None


def looks_like_log(head: bytes) -> bool:
    """Whether a file's first bytes are a log this module reads (before other formats get to guess)."""
    if b"\0" in head or head.lstrip()[:1] == b"{":
        return False
    if _GLOG_LINE.search(head) or _NCCL_LINE.search(head):
        return True
    if _FORMAT.begin is None:
        return False
    return bool(_markers(_FORMAT).findall(head.decode("utf-8", "surrogateescape")))


def load_log(data: bytes, path: str, sniffed: bool = True) -> RankTrace:
    """One rank's log; ValueError(reason) when it holds nothing to read. `sniffed`: looks_like_log said so (else
    this is the last format tried, and a file with nothing readable is simply not a trace)."""
    fmt = _FORMAT
    log = RankLog(path=path, lines=data.count(b"\n") + (0 if data.endswith(b"\n") else 1))
    read_markers(data, log, _markers(fmt))
    nccl = read_nccl(data.decode("utf-8", "surrogateescape"), log) if b"NCCL INFO" in data else None
    empty = not log.threads and not (nccl and nccl.entries)
    if empty and not sniffed:
        raise ValueError("unrecognized format: not a Flight Recorder pickle or JSON dump, nor a distdoctor trace, "
                         "nor a log with begin/end markers or NCCL INFO collective lines")
    if empty and nccl is not None and not log.threads:  # NCCL's default subsystems log the setup, not the calls
        raise ValueError("NCCL INFO lines but no collective call among them: run with NCCL_DEBUG=INFO "
                         "NCCL_DEBUG_SUBSYS=INIT,COLL to log the calls")
    rank = rank_of(path, fmt)
    if rank is None and nccl is not None:
        rank = nccl.world_rank
    if rank is None and empty:
        raise ValueError(empty_reason())
    if rank is None:
        hint = f" (--log-rank {fmt.rank!r} does not match it)" if fmt.rank else ""
        raise ValueError(f"cannot tell which rank wrote this log{hint}: name it rank_<r>.log or put it in a "
                         f"rank<r>/ folder, or pass --log-rank REGEX with a (?P<rank>...) group")
    return RankTrace(rank=rank, source="log", path=path, version="nccl" if nccl and nccl.entries else "",
                     world_size=nccl.world_size if nccl else None, entries=nccl.entries if nccl else [],
                     host=nccl.host if nccl else None, pid=nccl.pid if nccl else None, log=log)


def empty_reason() -> str:
    """Why a log with nothing to read is not used (link_logs says it only when its rank has no other trace: glog
    writes WARNING and ERROR files beside the INFO one)."""
    what = "--begin/--end markers" if _FORMAT.begin is not None else "before:/after: markers"
    return f"a log, but with no {what} nor NCCL INFO collective lines"


def _count_markers(events: list, log: RankLog, markers: _Markers) -> tuple[dict, dict, list]:
    """Per (thread, op): [begins, ends, index of the last begin, of the last end], and its distinct marker lines
    with their kinds; the indexes of the first few unreadable lines (counted in `log.skipped`)."""
    counts = Counter(events)
    last = dict(zip(events, itertools.count()))  # the last index of each distinct marker line
    per: dict[tuple[str, str], list] = {}
    values: dict[tuple[str, str], list] = {}
    bad: list[int] = []
    for value, n in counts.items():
        got = markers.parts(value)
        op = got[2].strip() if got else ""
        if not op or not op.isprintable():
            log.skipped += n
            at = -1
            for _ in range(min(n, SKIPPED_EXAMPLES)):
                at = events.index(value, at + 1)
                bad.append(at)
            continue
        thread, kind, _ = got
        c = per.get((thread, op))
        if c is None:
            c = per[(thread, op)] = [0, 0, -1, -1]
        if kind == "before":
            c[0] += n
            c[2] = max(c[2], last[value])
        else:
            c[1] += n
            c[3] = max(c[3], last[value])
        values.setdefault((thread, op), []).append((value, kind))
    return per, values, bad


def read_markers(data: bytes, log: RankLog, markers: _Markers) -> None:
    """Fill `log.threads` and `log.ops` from the marker lines of a log (see the module docstring)."""
    buf = markers.buffer(data)
    events = markers.findall(buf)
    if not events:
        return
    per, values, bad = _count_markers(events, log, markers)
    first = None  # the first index of each distinct line: needed only where ends outnumber their begins
    wanted: dict[int, None] = dict.fromkeys(sorted(bad)[:SKIPPED_EXAMPLES])  # event indexes whose line is cited
    opens: dict[str, list[tuple[int, str]]] = {}
    last_end: dict[str, tuple[int, str]] = {}
    for (thread, op), (b, d, ib, ie) in per.items():
        st = log.threads.get(thread)
        if st is None:
            st = log.threads[thread] = ThreadState()
        is_open = ib > ie
        paired = min(d, b - is_open)
        lost = d - paired  # ends without a begin: a begin line lost, or one end from before the log started
        if lost:
            if first is None:
                first = dict(zip(reversed(events), range(len(events) - 1, -1, -1)))
            starts_inside = min(first[v] for v, k in values[(thread, op)] if k == "after") < \
                min((first[v] for v, k in values[(thread, op)] if k == "before"), default=len(events))
            lost -= starts_inside  # that run began before the log: not one of its runs
        st.done += paired
        st.unclosed += b - is_open - paired
        st.unmatched_ends += d - paired
        done = paired + lost
        runs = done + is_open
        prev = log.ops.get(op)
        log.ops[op] = (runs, done, thread) if prev is None else \
            (prev[0] + runs, prev[1] + done, thread if runs > prev[0] else prev[2])
        if is_open:
            opens.setdefault(thread, []).append((ib, op))
            wanted[ib] = None
        if ie >= 0 and ie > last_end.get(thread, (-1, ""))[0]:
            last_end[thread] = (ie, op)
    for thread, (ie, op) in last_end.items():
        log.threads[thread].last_done = op
        wanted[ie] = None
    where = _locate(buf, markers, len(events), set(wanted), log.path)
    log.skipped_at = [where[i] for i in sorted(bad)[:SKIPPED_EXAMPLES] if i in where]
    end_time = None if markers.custom else _last_time(buf)
    for thread, st in log.threads.items():
        if thread in last_end:
            st.last_done_line = where.get(last_end[thread][0])
        ops = sorted(opens.get(thread, ()))
        if not ops:
            continue
        i, st.open_op = ops[-1]
        st.line = where.get(i)
        st.run = log.ops[st.open_op][0]
        st.also_open = [(op, where.get(j, "")) for j, op in ops[:-1]]
        if end_time is not None and st.line:
            begun = _time_of(_line_text(buf, where.pos[i]))
            st.open_for_s = round(end_time - begun, 3) if begun is not None else None


def link_logs(loaded: list[RankTrace], errors: list[LoadError]) -> list[RankTrace]:
    """Once every file is loaded: a rank's log beside another trace of that rank (a Flight Recorder dump, the
    recorder's trace) adds its thread state to that trace instead of competing with it; a log with nothing to read
    is dropped when its rank has another trace (glog's WARNING and ERROR files), else it is a LoadError; NCCL
    entries get their groups' members, global roots and peers, and their states (see the module docstring)."""
    full = [t for t in loaded if t.source != "log" or t.log.threads or t.entries]
    others: dict[int, list[RankTrace]] = {}
    for t in full:
        if t.source != "log":
            others.setdefault(t.rank, []).append(t)
    with_log = {t.rank for t in full}
    out = []
    for t in loaded:
        if t.source == "log" and not t.log.threads and not t.entries:
            if t.rank not in with_log:
                errors.append(LoadError(t.path, empty_reason()))
            continue
        if t.source == "log" and t.rank in others:
            for other in others[t.rank]:
                other.log = other.log or t.log
            continue
        out.append(t)
    logs = [t for t in out if t.source == "log" and t.entries and t.log is not None]
    if logs:
        link_nccl(logs)
    return out


class _Where(dict):
    """event index -> "file:line", and the text position of each (`pos`)."""
    pos: dict[int, int]


def _locate(buf, markers: _Markers, n_events: int, wanted: set[int], path: str) -> _Where:
    """Where the wanted events are: scan back from the end of the file in growing chunks (cut at line starts, so
    the matches of the chunks add up to the whole file's), until the earliest wanted event is reached."""
    out = _Where()
    out.pos = {}
    nl = markers.nl
    end, index_end, chunk = len(buf), n_events, 1 << 14
    while wanted and end > 0:
        start = buf.rfind(nl, 0, max(0, end - chunk)) + 1 if end > chunk else 0
        starts = markers.starts(buf, start, end)
        first = index_end - len(starts)
        if first < 0:  # a pattern that spans lines: fall back to one pass over the whole text
            starts, first = markers.starts(buf, 0, len(buf)), 0
        for i in [i for i in wanted if i >= first]:
            out.pos[i] = starts[i - first]
            wanted.discard(i)
        end, index_end, chunk = start, first, chunk * 2
    lines, prev, count = {}, 0, 1
    for pos in sorted(out.pos.values()):  # line numbers, counting newlines once along the file
        count += buf.count(nl, prev, pos)
        lines[pos], prev = count, pos
    for i, pos in out.pos.items():
        out[i] = f"{path}:{lines[pos]}"
    return out


def _line_text(buf, pos: int) -> str:
    nl = b"\n" if isinstance(buf, bytes) else "\n"
    end = buf.find(nl, pos)
    line = buf[pos:end if end >= 0 else len(buf)]
    return line.decode("utf-8", "replace") if isinstance(line, bytes) else line


def _time_of(line: str) -> float | None:
    """A glog line's time in seconds (year 2000 when the line has none: only differences within a log are used)."""
    m = _GLOG_TIME.match(line)
    if not m:
        return None
    year, month, day, hh, mm, ss = m.groups()
    try:
        sec = float(ss)
        t = datetime(int(year or 2000), int(month), int(day), int(hh), int(mm), int(sec))
    except ValueError:
        return None
    return t.timestamp() + (sec - int(sec))


def _last_time(buf: bytes) -> float | None:
    """The time of the log's last glog line (looking back at most a few hundred lines)."""
    end = len(buf)
    for _ in range(500):
        start = buf.rfind(b"\n", 0, max(end - 1, 0)) + 1
        t = _time_of(buf[start:end].decode("utf-8", "replace"))
        if t is not None:
            return t
        if start == 0:
            return None
        end = start - 1
    return None


__all__ = ["LogFormat", "using_format", "current_format", "looks_like_log", "load_log", "link_logs", "rank_of",
           "read_markers"]
