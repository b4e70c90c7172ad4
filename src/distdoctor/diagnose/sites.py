"""Where the ranks parted, in the user's own code: every finding names the file:line of the calls it is about.

Call sites come from, best first:
- the entry's own frames: the recorder's call sites, or Flight Recorder's pickle frames (the Python stack of the
  call; Flight Recorder's JSON dumps have none, and the recorder's `.fr.pkl` is written without them);
- for the call a rank is blocked in at dump time, and for a rank in no call, the current stack of its main
  thread (the recorder's dump): a call issued from C++ or deep inside a library is still called from there.
Of a stack only the user's frames count: not torch's, not distdoctor's, not the standard library nor its call
plumbing (trace.code_origin, the one rule diagnose, lint, sim and the recorder share), innermost first, at most three ("forward (model.py:43) <- train (train.py:70)").

What each finding names (`annotate`, the last step of the analysis):
- missing_ranks: where the ranks that issued the collective called it, and where each absent rank is (its
  stack), else the call it is blocked in, else its last call; for a p2p one, where the waiting ranks wait;
- type/size/dtype/root_mismatch, state_mismatch: where the culprits (the stuck ranks) called it, and the others;
- order_deadlock, p2p_deadlock, stuck_collective: where each rank named is blocked;
- crashed: where the others wait for it (where it raised is crash.py's);
- missing_dump: where the ranks blocked on the lost ones wait, else where the survivors got to (the last
  collective on the default group, else each survivor's stack or last call);
- straggler: where the late rank was last on time and where it was first late (straggler.py): the time is
  lost between the two (a DDP gradient bucket issued from C++ has no call site; the other may).
Each finding gets `evidence["sites"]` ([{"ranks", "what", "site"}]) and one sentence at the end of its detail,
"In the code: ...". A site the detail already gives is not repeated; a finding about
traces without frames gets nothing. At most MAX_RANKS ranks are looked at per part (a thousand-rank finding
has a handful of distinct sites).
"""

from __future__ import annotations

from distdoctor.diagnose.match import GroupView
from distdoctor.diagnose.progress import main_stack
from distdoctor.findings.kinds import Finding, fmt_ranks, numbered
from distdoctor.trace.code_origin import is_user_code
from distdoctor.trace.model import Entry, Frame, RankTrace, TraceSet

MAX_RANKS = 64
CHAIN = 3  # user frames per site
_MISMATCH = ("type_mismatch", "size_mismatch", "dtype_mismatch", "root_mismatch", "state_mismatch")


def user_chain(frames: list[Frame]) -> list[Frame]:
    """The user's frames of a stack (innermost last, as traces keep them), innermost first, at most CHAIN."""
    out = []
    for f in reversed(frames):
        if is_user_code(f.filename):
            out.append(f)
            if len(out) == CHAIN:
                break
    return out


def fmt_chain(chain: list[Frame]) -> str:
    """'forward (/abs/model.py:43) <- train (train.py:70)': the innermost frame in full, the callers short."""
    return " <- ".join(str(f) if i == 0 else f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.line})"
                       for i, f in enumerate(chain))


def stack_site(trace: RankTrace | None) -> str | None:
    """Where the rank's main thread is now, in the user's code (recorder dumps have stacks)."""
    got = main_stack(trace) if trace is not None else None
    chain = user_chain(got[1]) if got else []
    return fmt_chain(chain) if chain else None


def entry_site(e: Entry | None, trace: RankTrace | None = None, blocked: bool = False) -> str | None:
    """Where the call was made: its own frames, else (for the call the rank is blocked in) its main stack."""
    if e is None:
        return None
    chain = user_chain(e.frames)
    if chain:
        return fmt_chain(chain)
    return stack_site(trace) if blocked else None


class Sites:
    def __init__(self, ts: TraceSet, views: dict[str, GroupView], pending: dict[int, list[Entry]]) -> None:
        self.ts, self.views, self.pending = ts, views, pending

    def _blocked_in(self, r: int, e: Entry | None) -> bool:
        return e is not None and any(p is e or (p.group, p.seq, p.op) == (e.group, e.seq, e.op) and not e.is_p2p
                                     for p in self.pending.get(r, [])[:1])

    def at(self, ranks, group: str | None, seq: int | None) -> dict[str, list[int]]:
        """site -> ranks, for the collective (group, seq) as each rank issued it."""
        view = self.views.get(group) if group is not None else None
        out: dict[str, list[int]] = {}
        if view is None or seq is None:
            return out
        for r in sorted(ranks)[:MAX_RANKS]:
            e = view.by_rank.get(r, {}).get(seq)
            site = entry_site(e, self.ts.ranks.get(r), self._blocked_in(r, e))
            if site:
                out.setdefault(site, []).append(r)
        return out

    def blocked(self, ranks) -> dict[str, list[int]]:
        """site -> ranks, for the call each rank is blocked in (else where it is now)."""
        out: dict[str, list[int]] = {}
        for r in sorted(ranks)[:MAX_RANKS]:
            pend = self.pending.get(r) or []
            trace = self.ts.ranks.get(r)
            site = entry_site(pend[0], trace, True) if pend else stack_site(trace)
            if site:
                out.setdefault(site, []).append(r)
        return out

    def now(self, r: int) -> tuple[str, str] | None:
        """(what, site) for a rank in no collective the others wait for: its stack, else its last call."""
        trace = self.ts.ranks.get(r)
        if trace is None:
            return None
        site = stack_site(trace)
        if site:
            return "is at", site
        pend = self.pending.get(r) or []
        if pend:
            site = entry_site(pend[0], trace, True)
            return ("is blocked in a call from", site) if site else None
        for e in reversed(trace.entries[-MAX_RANKS:]):
            site = entry_site(e)
            if site:
                seq = e.p2p_seq if e.is_p2p else e.seq
                return f"last called {e.op} #{seq} on group '{e.group}' from", site  # its number is that group's
        return None

    @staticmethod
    def _call_of(view, ranks: list[int], seq: int | None) -> str | None:
        """'op #seq' when the ranks' entries at `seq` all name one op, else None."""
        ops = {e.op for r in ranks[:MAX_RANKS] if view is not None
               for e in [view.by_rank.get(r, {}).get(seq)] if e is not None}
        return f"{ops.pop()} #{seq}" if len(ops) == 1 else None

    # ---- per finding ----------------------------------------------------------------------------------------
    def parts(self, f: Finding) -> list[tuple[list[int], str, str]]:
        """(ranks, what they did, site) for the finding."""
        out: list[tuple[list[int], str, str]] = []
        call = numbered(f.op, f.seq) if f.op else "it"
        ev = f.evidence

        def add(sites: dict[str, list[int]], what: str) -> None:
            out.extend((rs, what, site) for site, rs in sites.items())

        if f.kind == "missing_ranks":
            # p2p.py gives [[waiting rank, peer]]; the wait-for graph gives waiting ranks, whatever the op
            if ev.get("waiting") and isinstance(ev["waiting"][0], (list, tuple)):
                add(self.blocked([w for w, _ in ev["waiting"]]), "blocked in a call from")
            elif ev.get("waiting"):
                add(self.blocked(ev["waiting"]), f"waiting in {call}, called from")
            else:
                add(self.at(ev.get("issued_by", []), f.group, f.seq), f"called {call} from")
            for r in f.ranks[:MAX_RANKS]:
                got = self.now(r)
                if got:
                    out.append(([r], got[0], got[1]))
        elif f.kind in _MISMATCH:
            view = self.views.get(f.group)
            others = [r for r in (view.by_rank if view is not None else ()) if r not in f.ranks]
            for ranks in (f.ranks, others):  # each side by the call its own entries show (a type_mismatch's differ)
                add(self.at(ranks, f.group, f.seq), f"called {self._call_of(view, ranks, f.seq) or call} from")
        elif f.kind in ("order_deadlock", "p2p_deadlock", "stuck_collective"):
            add(self.blocked(f.ranks), "blocked in a call from")
        elif f.kind == "crashed" and ev.get("others_wait_in"):
            w = ev["others_wait_in"]
            add(self.at(w["ranks"], w["group"], w["seq"]),
                f"waiting for it in {w['op']} #{w['seq']} on group '{w['group']}', called from")
        elif f.kind == "missing_dump":
            if ev.get("blocked"):
                add(self.blocked(ev["blocked"]), "waiting for it in a call from")
            elif f.seq is not None:
                add(self.at([r for r in self.ts.ranks], f.group, f.seq), f"got as far as {call}, called from")
            else:  # no collective on the default group: where each survivor is
                for r in sorted(self.ts.ranks)[:MAX_RANKS]:
                    got = self.now(r)
                    if got:
                        out.append(([r], got[0], got[1]))
        elif f.kind == "straggler":
            out.extend(self._straggler(f))
        return out

    def _straggler(self, f: Finding) -> list[tuple[list[int], str, str]]:
        """Where the late rank was last on time, and where it was first late (straggler.py's bracket)."""
        out = []
        for key, what in (("on_time_at", "on time at"), ("late_from", "late from")):
            c = f.evidence.get(key)
            if c:
                add = self.at(f.ranks, f.group, c["seq"])
                out.extend((rs, f"{what} {c['op']} #{c['seq']}, called from", site) for site, rs in add.items())
        return out


def annotate(findings: list[Finding], ts: TraceSet, views: dict[str, GroupView],
             pending: dict[int, list[Entry]]) -> None:
    """Add the user's call sites to every finding (see the module's docstring)."""
    sites = Sites(ts, views, pending)
    for f in findings:
        merged: dict[tuple[str, str], list[int]] = {}  # the same call site for everyone is said once
        for rs, what, site in sites.parts(f):
            if site not in f.detail:
                merged.setdefault((what, site), []).extend(rs)
        parts = [(sorted(set(rs)), what, site) for (what, site), rs in merged.items()]
        if not parts:
            continue
        f.evidence["sites"] = [{"ranks": rs, "what": what, "site": site} for rs, what, site in parts]
        words = "; ".join(f"{fmt_ranks(rs)} {what} {site}" for rs, what, site in parts[:6])
        more = f"; and {len(parts) - 6} more" if len(parts) > 6 else ""
        f.detail += f" In the code: {words}{more}."
