"""Even votes: when the members of a group split evenly (one against one in a group of two), the count cannot say
who is odd. The evidence can:

- sibling groups: the groups of the same size and description (a DeviceMesh dimension's groups, the TP groups
  of every data-parallel replica), disjoint from this one, ran the same program; what their members issued at
  the same sequence number is what this group's members should have issued;
- completed calls: when only one side's call completed, it met members that agreed with it (members whose
  traces do not record what is compared, Flight Recorder's roots, do not vote; a broadcast's or scatter's root
  alone completes by sending, agreed with or not); for roots, when only the root one side names completed its
  call;
- the call site's history: what the members passed at the same call site before (the same user frames; without
  frames, the same op and dtype), read by a call's place in its visit where that tells: a side passing what was always
  passed there beside a side passing what never was (a size or dtype changed, the sizes call of an object
  collective skipped) is not the odd one (a site with no history, a call made once, says nothing);
- an error of its own: a member whose call raised, not a communication failure (torch's check of its own
  arguments), is the odd one, even where the count names every member (all_to_all's conservation);
- a rank-conditional call site: a call issued from inside an `if` that tests the rank (`if rank == 0:` around a
  log line's all_gather) is the odd one beside a call that is not.

Where neither tells, the finding names every tied rank and says so ("one of ranks 0, 1: ..."), never a coin toss.
match.py marks a tie in the divergence's evidence (`tie`: what was compared and the classes); this module decides.
"""

from __future__ import annotations

import linecache
import re
from collections import Counter

from distdoctor.collectives.names import dtype_signature
from distdoctor.trace.code_origin import is_user_code
from distdoctor.world.failures import is_comm_failure

_RANK_TEST = re.compile(r"^\s*(?:el)?if\b.*\brank\b")


def tied(classes: dict) -> bool:
    """The two largest classes of a vote are as large as each other."""
    sizes = sorted((len(rs) for rs in classes.values()), reverse=True)
    return len(sizes) > 1 and sizes[0] == sizes[1]


def value_of(key: str, e, members: list[int]) -> str | None:
    """What a member's entry says about `key`, spelled as match.py's classes spell it (roots as group ranks)."""
    if key == "op":
        return str(e.op)
    if key in ("in_sizes", "out_sizes"):
        return repr(getattr(e, key))
    if key == "dtypes":
        return str(dtype_signature(e.in_dtypes, e.out_dtypes))
    if key == "root":
        return str(members.index(e.root)) if e.root in members else None
    return None


def sibling_groups(view, views: dict, size: int | None = None) -> list:
    """The groups that run this group's program beside it: the same description and size (`size`: the size it
    should have, where the traces name only some of its members), and no member in common - a DeviceMesh
    dimension's groups for the other replicas."""
    size = len(view.members) if size is None else size
    mine = set(view.members)
    return [o for o in views.values() if o is not view and o.desc == view.desc and len(o.members) == size
            and not mine & set(o.members)]


def sibling_votes(view, views: dict, seq: int, key: str) -> Counter:
    """What the members of this group's siblings issued at `seq`, counted by value."""
    votes: Counter = Counter()
    for other in sibling_groups(view, views):
        for m in other.members:
            e = other.by_rank.get(m, {}).get(seq)
            if e is not None:
                value = value_of(key, e, other.members)
                if value is not None:
                    votes[value] += 1
    return votes


def rank_conditional(e) -> str | None:
    """`file:line` of the `if ... rank ...` around the user's call that issued `e`, when there is one."""
    frames = [f for f in reversed(e.frames or []) if is_user_code(f.filename)]
    for f in frames[:3]:
        line = linecache.getline(f.filename, f.line)
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        for n in range(f.line - 1, max(0, f.line - 40), -1):
            text = linecache.getline(f.filename, n)
            if not text.strip() or text.lstrip().startswith("#"):
                continue
            outer = len(text) - len(text.lstrip())
            if outer < indent:
                if _RANK_TEST.match(text):
                    return f"{f.filename.rsplit('/', 1)[-1]}:{n}: {text.strip()}"
                indent = outer
                if outer == 0:
                    break
    return None


def own_errors(view, d) -> list[int]:
    """The members whose call at `d.seq` raised an error of their own: not a communication failure (a peer
    gone, a timeout, an abort), so it did not come from the others (torch's check of the rank's own arguments,
    e.g. split sizes that do not add up to the input)."""
    out = []
    for r in d.ranks:
        e = view.by_rank.get(r, {}).get(d.seq)
        if e is not None and e.error and not is_comm_failure(str(e.error)):
            out.append(r)
    return out


def break_tie(d, view, views: dict) -> None:
    """Decide a tied divergence `d` of group `view` by the evidence, or name every tied rank (in place)."""
    tie = d.evidence.get("tie")
    if not tie:
        return
    own = own_errors(view, d)
    if own and len(own) < len(d.ranks):
        d.ranks = own
        tie.pop("undecided", None)
        tie["decided_by"] = "own error"
        d.detail = d.detail.replace("; nothing in the traces says whose", "") + "; " + "; ".join(f"rank {r}'s own call raised {view.by_rank[r][d.seq].error[:160]!r}"
                                     for r in own) + " (no communication failure: its arguments)"
        return
    if tie.get("undecided"):
        return
    key, classes = tie["key"], tie["classes"]
    local = (lambda v: str(view.members.index(int(v))) if int(v) in view.members else v) if key == "root" \
        else (lambda v: v)
    votes = sibling_votes(view, views, d.seq, key)
    scores = {v: votes.get(local(v), 0) for v in classes}
    best = max(scores.values(), default=0)
    winners = [v for v, s in scores.items() if s == best]
    if best > 0 and len(winners) == 1:
        odd = sorted(r for v, rs in classes.items() if v != winners[0] for r in rs)
        d.ranks = odd
        tie["decided_by"] = "sibling groups"
        d.detail += (f"; the members split evenly, and {best} member(s) of the sibling groups issued what "
                     f"{_ranks(classes[winners[0]])} issued at #{d.seq}")
        return
    present = {r: view.by_rank.get(r, {}).get(d.seq) for rs in classes.values() for r in rs}
    usual = site_history(view, d.seq, key, classes, present)
    if usual is not None:
        d.ranks = sorted(r for v, rs in classes.items() if v != usual for r in rs)
        tie["decided_by"] = "call site history"
        d.detail += (f"; the members split evenly, and what {_ranks(classes[usual])} passed is what the members "
                     f"always passed at that call site before, while {_ranks(d.ranks)}'s never was")
        return
    done = [v for v, rs in classes.items() if all(present[r] is not None and view.is_done(r, present[r]) for r in rs)
            and not (key != "root" and present[rs[0]].op in SENDS_FROM_ROOT and len(rs) == 1
                     and present[rs[0]].root in (None, rs[0]))]  # a root (or maybe one: no roots recorded) alone,
    # whatever the op the divergence is named by (its own call may be the odd broadcast)
    if key == "root" and not done:  # the root a side names completed its call: it sent what that side expects
        done = [v for v in classes if _completed(view, int(v), d.seq)]
    if len(done) == 1:  # only one side's call completed: it found members that agreed with it
        d.ranks = sorted(r for v, rs in classes.items() if v != done[0] for r in rs)
        tie["decided_by"] = "completed calls"
        d.detail += (f"; the members split evenly, and only {_ranks(classes[done[0]])}'s call completed (it met "
                     "members that agreed with it)")
        return
    conditional = {r: site for r, e in present.items() if e is not None for site in [rank_conditional(e)] if site}
    if conditional and len(conditional) < len(present):
        d.ranks = sorted(conditional)
        tie["decided_by"] = "rank-conditional call site"
        d.detail += "; the members split evenly, and " + "; ".join(
            f"rank {r}'s call comes from a branch on the rank ({site})" for r, site in sorted(conditional.items()))
        return
    d.ranks = sorted(present)
    tie["undecided"] = d.evidence["undecided"] = True  # (the top-level mark every finding that cannot tell carries)
    d.detail += ("; the members split evenly and nothing in the traces (sibling groups, rank-conditional call "
                 "sites) says which of them is odd")


SENDS_FROM_ROOT = ("broadcast", "scatter")  # the root's call completes once it sent, whatever the others passed
HISTORY = 64  # earlier calls of the group a call site's history is read from


def _site(e, key: str) -> tuple | None:
    """Where a call comes from: its user frames; without frames, its op (and dtypes, unless they are compared)."""
    frames = tuple((f.filename, f.line) for f in (e.frames or []) if is_user_code(f.filename))
    if frames:
        return frames
    if key == "op":
        return None
    return (e.op,) if key == "dtypes" else (e.op, str(dtype_signature(e.in_dtypes, e.out_dtypes)))


def site_history(view, seq: int, key: str, classes: dict, present: dict) -> str | None:
    """The one side whose value the members always passed at its call site before, when every other side's site
    has a history that never held its value: that side is the usual one. A site is read first with the call's
    place among those one visit to it makes (`_context`), then as a whole; the first reading that decides is the
    answer (the finer history holds fewer values, so it can only decide where the whole site's would not, never
    against it)."""
    for depth in (1, 0):
        usual = _usual_at(view, seq, key, classes, present, depth)
        if usual is not None:
            return usual
    return None


def _context(seqs: dict, s: int, key: str, depth: int) -> tuple | None:
    """Call `s`'s site (depth 0), or its site and its place in the run of calls from that site (depth 1): one line
    that makes several calls a visit (an object collective: sizes, then data) passes each its own value, told
    apart by their place; a rank that skipped one shows the next in the skipped one's place. Only for sites read
    from frames: visits one after another with no other call between run together, their places ones never
    seen before, which decide nothing; sites named by their op alone run into each other's."""
    site = _site(seqs[s], key)
    if site is None or depth == 0:
        return site
    if not seqs[s].frames:  # a site named by its op: another step's calls of that op run into its visits
        return None
    k = 0
    while (s - k - 1) in seqs and _site(seqs[s - k - 1], key) == site:
        k += 1
    return site, k


def _usual_at(view, seq: int, key: str, classes: dict, present: dict, depth: int) -> str | None:
    sites = {r: _context(view.by_rank[r], seq, key, depth) for r, e in present.items() if e is not None}
    if len(sites) < len(present) or None in sites.values():
        return None
    wanted = set(sites.values())
    bare = {_site(present[r], key) for r in sites}
    seen: dict[tuple, set] = {}
    known: set = set()  # the sites (as a whole) with a history
    for m, seqs in view.by_rank.items():
        for s in sorted(x for x in seqs if x < seq)[-HISTORY:]:
            site = _site(seqs[s], key)
            if site not in bare:
                continue
            known.add(site)
            context = _context(seqs, s, key, depth)
            if context in wanted:
                seen.setdefault(context, set()).add(value_of(key, seqs[s], view.members))
    usual, changed = [], []
    for v, rs in classes.items():
        # a finer context never seen at a site that has a history: nothing was ever passed there in that place
        history = [seen.get(sites[r], set() if depth and _site(present[r], key) in known else None) for r in rs]
        if any(h is None for h in history):
            return None  # a site with no history says nothing
        if all(value_of(key, present[r], view.members) in h for r, h in zip(rs, history)):
            usual.append(v)
        elif not any(value_of(key, present[r], view.members) in h for r, h in zip(rs, history)):
            changed.append(v)
    return usual[0] if len(usual) == 1 and len(changed) == len(classes) - 1 else None


def _completed(view, rank: int, seq: int) -> bool:
    e = view.by_rank.get(rank, {}).get(seq)
    return e is not None and view.is_done(rank, e)


def _ranks(ranks) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
