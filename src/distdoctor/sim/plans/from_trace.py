"""A recorded run as a program: what each rank's threads issued, when, and how long each call took.

`load_recorded(paths)` reads the recorder's dumps (`rank_<r>.jsonl`, with `rank_<r>.fr.pkl` merged in) or
Flight Recorder pickle/JSON dumps through `trace`'s loaders; `replay_program(traces, options)` turns them
into the IR:

- per rank and recording thread a host stream `host <thread>` runs, in recorded order, the compute gaps
  between calls (`compute`, measured) and the calls: issuing call i records event `i<i>`; a blocking call
  then waits for `d<i>`, an async one (or one whose kind the dump does not say) is waited where its `wait()`
  returned (the recorder completes an async record there), or never when the trace does not say;
- each call runs on a communication stream (waits for `i<i>`, runs, records `d<i>`): with `streams=
  "per-group"` a stream per process group for collectives (`comm <group>`) and one per group and peer for
  send/recv (`p2p <group> peer <peer>`, NCCL's stream per pair); with `"shared"` one `comm` stream for all;
- a collective's duration is its instance's: from the last member's issue to the first member's return
  (a blocking call waits for every member, so that is the transfer, without anyone's lateness); async
  calls return at `wait()`, which may be later than the transfer, so they take the lower median of blocking calls
  of the same group, kind and size (else kind and size, else kind; else the cost model), never more than
  their recorded span; send/recv pairs the same way (FIFO per sender, receiver and group);
- p2p sends are buffered without limit (Gloo posts a send and returns) unless `eager_bytes` is given: then
  a send above it waits for its receive (the IR's eager p2p).

Ring buffers that wrapped drop a group's oldest collectives on some ranks: each group starts at the highest
first sequence number among its members. Calls that are neither collectives nor p2p (object collectives'
inner calls are recorded as collectives; `other:` ops) are counted and left out, and so are p2p calls with a
rank whose Flight Recorder dump holds no p2p at all (Gloo's Flight Recorder records none).
"""

from __future__ import annotations

import heapq
import os
from dataclasses import dataclass, field
from statistics import median_low

from distdoctor.collectives.base import itemsize
from distdoctor.errors import InputError
from distdoctor.sim.engine import collective_us, p2p_us
from distdoctor.sim.ir import COLLECTIVE_KINDS, Cost, Op, Program, RankProgram
from distdoctor.trace.code_origin import is_library
from distdoctor.trace.model import Entry, RankTrace, TraceSet, numel

STREAM_MODES = ("per-group", "shared")
UNBOUNDED = 1 << 60  # eager bytes that no run fills: every send is buffered
_KINDS = set(COLLECTIVE_KINDS.values())


@dataclass
class Call:
    """One usable call of a rank, with what the program needs of it."""

    entry: Entry
    thread: str
    nbytes: int = 0
    duration_us: float | None = None  # filled once the instance it belongs to is known
    end: float | None = None  # when its instance ended, on the recorded clock (last issue + duration)


@dataclass
class Replay:
    program: Program
    recorded_makespan_us: float | None
    calls: int
    estimated: int  # calls whose duration is not their own instance's
    skipped: dict[str, int] = field(default_factory=dict)  # left-out raw op -> count
    trimmed: int = 0  # calls before a group's common first sequence number (a wrapped ring buffer)
    source: str = ""
    calls_by_rank: dict[int, list[Call]] = field(default_factory=dict, repr=False)
    unfinished: dict[int, str] = field(default_factory=dict)  # rank -> why its recording did not end normally

    def info(self, simulated_us: float) -> dict:
        rec = self.recorded_makespan_us
        return {"ranks": len(self.program.ranks), "calls": self.calls, "estimated_durations": self.estimated,
                "skipped": dict(self.skipped), "trimmed": self.trimmed,
                "recorded_makespan_us": None if rec is None else round(rec, 3),
                "simulated_makespan_us": round(simulated_us, 3),
                "difference_us": None if rec is None else round(simulated_us - rec, 3),
                "ratio": None if not rec else round(simulated_us / rec, 4),
                "recording_unfinished": {str(r): why for r, why in self.unfinished.items()}}

    def warning(self) -> str:
        """A line before the report when the recording itself hung or crashed ('' when it finished)."""
        if not self.unfinished:
            return ""
        kinds = sorted(set(self.unfinished.values()))
        ranks = ", ".join(map(str, sorted(self.unfinished)))
        return (f"Note: this recording did not finish ({'; '.join(kinds)} on rank(s) {ranks}): the replay stops where "
                f"the run did. `distdoctor diagnose` explains a recorded hang or crash; from-trace's what-ifs are "
                f"for runs that finished.")

    def sentence(self, simulated_us: float, deadlock: bool = False) -> str:
        rec = self.recorded_makespan_us
        left = f"; left out {sum(self.skipped.values())} call(s) (--format json: skipped)" if self.skipped else ""
        est = f" ({self.estimated} with estimated durations)" if self.estimated else ""
        head = f"Recorded run: {self.calls} calls{est} on {len(self.program.ranks)} ranks"
        if rec is None:
            return f"{head}, no timestamps{left}."
        if deadlock:
            return f"{head} finished in {rec:.1f} us; this replay deadlocks at {simulated_us:.1f} us{left}."
        diff = simulated_us - rec
        return (f"{head} in {rec:.1f} us; simulated {simulated_us:.1f} us ({diff:+.1f} us, "
                f"x{simulated_us / rec:.3f} of recorded){left}.")


def load_recorded(paths: list[str]) -> TraceSet:
    """The traces under `paths`; any file that cannot be read is a bad input (a replay needs every rank)."""
    from distdoctor.trace.loaders import load_traces

    for p in paths:
        if not os.path.exists(p):
            raise InputError(p, "no such file or directory")
    ts = load_traces(list(paths))
    if ts.errors:
        more = f" (and {len(ts.errors) - 1} more)" if len(ts.errors) > 1 else ""
        raise InputError(ts.errors[0].path, ts.errors[0].reason + more)
    if not ts.ranks:
        raise InputError(" ".join(paths), "no rank traces found (recorder rank_<r>.jsonl or Flight Recorder dumps)")
    return ts


def call_site(e: Entry) -> str:
    """The user's innermost frame as file:line (frames are innermost last), '' when none is recorded."""
    for f in reversed(e.frames):
        if not is_library(f.filename):
            return f"{os.path.basename(f.filename)}:{f.line}"
    return ""


def _bytes(e: Entry) -> int:
    sizes, dtypes = (e.in_sizes, e.in_dtypes) if e.in_sizes else (e.out_sizes, e.out_dtypes)
    try:
        width = itemsize(dtypes[0]) if dtypes else 4
    except KeyError:
        width = 4
    return numel(sizes) * width


def _calls(trace: RankTrace, skipped: dict[str, int]) -> list[Call]:
    out = []
    for e in trace.entries:
        if e.op in _KINDS or e.op in ("send", "recv"):
            if e.is_p2p and e.peer is None:
                skipped[f"{e.op} (peer unknown)"] = skipped.get(f"{e.op} (peer unknown)", 0) + 1
                continue
            out.append(Call(e, e.stream or "main", _bytes(e)))
        else:
            name = e.raw_op or e.op
            skipped[name] = skipped.get(name, 0) + 1
    return out


def _unfinished(ts: TraceSet) -> dict[int, str]:
    out = {}
    for r, t in ts.ranks.items():
        if t.exception:
            out[r] = f"{t.exception.get('type') or 'an exception'} raised"
        elif t.hang:
            out[r] = "hang"
        elif (t.dump_reason or "").startswith(("exception", "hang", "signal")):
            out[r] = t.dump_reason.split(":")[0]
    return out


def _drop_unseen_p2p(ts: TraceSet, calls: dict[int, list[Call]], skipped: dict[str, int]) -> None:
    """Leave out p2p calls to a rank whose dump cannot show them: a Flight Recorder dump without any p2p entry
    (Gloo's records none). Replayed, they would wait forever for a partner that did post them."""
    blind = {r for r, cs in calls.items() if ts.ranks[r].source.startswith("flight_recorder")
             and not any(c.entry.is_p2p for c in cs)}
    if not blind:
        return
    why = "send/recv with a rank whose Flight Recorder dump records no p2p"
    for r, cs in calls.items():
        kept = [c for c in cs if not (c.entry.is_p2p and c.entry.peer in blind)]
        if len(kept) < len(cs):
            skipped[why] = skipped.get(why, 0) + len(cs) - len(kept)
            cs[:] = kept


def _span_us(members: list[Entry]) -> float | None:
    """From the last member's issue to the first member's return, in us (None without timestamps)."""
    created = [e.t_created for e in members]
    done = [e.t_completed for e in members if e.t_completed is not None]
    if None in created or not done:
        return None
    return max(0.0, (min(done) - max(created)) * 1e6)


def _assign_durations(instances: list[list[Call]], kind_of, cost: Cost) -> int:
    """Set every call's duration from its instance; returns how many were estimated."""
    own: dict[tuple, list[float]] = {}
    spans = []
    for inst in instances:
        span = _span_us([c.entry for c in inst])
        blocking = all(c.entry.async_op is False for c in inst) and len(inst) > 1
        spans.append((span, blocking))
        if blocking and span is not None:
            for key in kind_of(inst[0]):
                own.setdefault(key, []).append(span)
    # the lower median: a group's first call also connects its communicator (tens of ms on Gloo)
    typical = {k: median_low(v) for k, v in own.items()}
    estimated = 0
    for inst, (span, blocking) in zip(instances, spans):
        if blocking and span is not None:
            d = span
        else:
            d = next((typical[k] for k in kind_of(inst[0]) if k in typical), None)
            if d is None:
                e = inst[0].entry
                op = Op(e.op, kind=e.op, bytes=inst[0].nbytes)
                d = p2p_us(op, cost.alpha_us, cost.gbps) if e.is_p2p else \
                    collective_us(op, max(2, len(inst)), cost.alpha_us, cost.gbps)
            if span is not None:
                d = min(d, span)
            estimated += len(inst)
        created = [c.entry.t_created for c in inst]
        end = None if None in created else max(created) + d * 1e-6
        for c in inst:
            c.duration_us, c.end = d, end
    return estimated


def _collective_instances(calls: dict[int, list[Call]], members: dict[str, list[int]]) -> tuple[list, int]:
    """Per group, the n-th collective of every member, from the group's common first sequence number."""
    per_group: dict[str, dict[int, list[Call]]] = {}
    for r, cs in calls.items():
        for c in cs:
            if not c.entry.is_p2p:
                per_group.setdefault(c.entry.group, {}).setdefault(r, []).append(c)
    instances, trimmed = [], 0
    for g, by_rank in per_group.items():
        firsts = [cs[0].entry.seq for cs in by_rank.values()]
        start = max(firsts) if None not in firsts and len(by_rank) == len(members[g]) else None
        for r, cs in by_rank.items():
            if start is not None:
                keep = [c for c in cs if c.entry.seq is None or c.entry.seq >= start]
                if len(keep) < len(cs):
                    trimmed += len(cs) - len(keep)
                    dropped = {id(c) for c in cs} - {id(c) for c in keep}
                    calls[r][:] = [c for c in calls[r] if id(c) not in dropped]
                    by_rank[r] = keep
        depth = max(len(cs) for cs in by_rank.values())
        for n in range(depth):
            instances.append([cs[n] for cs in by_rank.values() if n < len(cs)])
    return instances, trimmed


def _p2p_instances(calls: dict[int, list[Call]]) -> list[list[Call]]:
    sends: dict[tuple, list[Call]] = {}
    recvs: dict[tuple, list[Call]] = {}
    for r, cs in calls.items():
        for c in cs:
            e = c.entry
            if e.op == "send":
                sends.setdefault((r, e.peer, e.group), []).append(c)
            elif e.op == "recv":
                recvs.setdefault((e.peer, r, e.group), []).append(c)
    out = []
    for key in sends.keys() | recvs.keys():
        s, rv = sends.get(key, []), recvs.get(key, [])
        for k in range(max(len(s), len(rv))):
            out.append([x[k] for x in (s, rv) if k < len(x)])
    return out


def _kind_keys(c: Call) -> tuple:
    e = c.entry
    b = c.nbytes
    op = "p2p" if e.is_p2p else e.op
    return ((e.group, op, b), (op, b), (op,))


def _host_events(calls: list[Call]) -> list[tuple[str, float | None, Call]]:
    """One thread's calls as the host saw them: issue, return of a blocking call, return of an async wait."""
    events: list[tuple[str, float | None, Call]] = []
    waits: list[tuple[float, int, Call]] = []  # heap of async waits by return time
    for k, c in enumerate(calls):
        e = c.entry
        while waits and e.t_created is not None and waits[0][0] <= e.t_created:
            t, _, w = heapq.heappop(waits)
            events.append(("wait", t, w))
        events.append(("issue", e.t_created, c))
        if e.async_op is False:
            events.append(("return", e.t_completed, c))
        elif e.t_completed is not None and e.state == "completed":
            # async, or not known (an entry only Flight Recorder saw: DDP's reducer calls c10d from C++)
            heapq.heappush(waits, (e.t_completed, k, c))
    while waits:
        t, _, w = heapq.heappop(waits)
        events.append(("wait", t, w))
    return events


def _comm_stream(e: Entry, r: int, streams: str) -> str:
    if streams == "shared":
        return "comm"
    return f"p2p {e.group} peer {e.peer}" if e.is_p2p else f"comm {e.group}"


def _comm_op(c: Call, r: int, p2p_n: dict[tuple, int]) -> Op:
    e = c.entry
    site = call_site(e)
    if e.is_p2p:
        src, dst = (r, e.peer) if e.op == "send" else (e.peer, r)
        key = (src, dst, e.group, e.op)  # each side counts its own posts
        p2p_n[key] = n = p2p_n.get(key, 0) + 1
        # a send and its receive carry the same name: the engine reports crossed messages by name
        return Op(e.op, f"{src}->{dst} #{n}", c.duration_us, bytes=c.nbytes, peer=e.peer, tag=e.group)
    name = " ".join(x for x in (f"#{e.seq}" if e.seq is not None else "", site) if x)
    root = e.root if e.op in ("broadcast", "reduce", "gather", "scatter") else None
    return Op("collective", name, c.duration_us, group=e.group, kind=e.op, bytes=c.nbytes, root=root)


def replay_program(ts: TraceSet, streams: str = "per-group", eager_bytes: int | None = None,
                   source: str = "recorded run") -> Replay:
    """The recorded run as a program (see the module's docstring)."""
    from distdoctor.trace.loaders import gc_paused

    with gc_paused():  # tens of thousands of small objects beside a big trace set: no collection passes
        return _replay_program(ts, streams, eager_bytes, source)


def _replay_program(ts: TraceSet, streams: str, eager_bytes: int | None, source: str) -> Replay:
    if streams not in STREAM_MODES:
        raise InputError("--streams", f"unknown mode {streams!r} (expected one of: {', '.join(STREAM_MODES)})")
    skipped: dict[str, int] = {}
    calls = {r: _calls(t, skipped) for r, t in sorted(ts.ranks.items())}
    _drop_unseen_p2p(ts, calls, skipped)
    used_groups = {c.entry.group for cs in calls.values() for c in cs if not c.entry.is_p2p}
    members: dict[str, list[int]] = {}
    for g in sorted(used_groups):
        info = next((t.groups[g] for t in ts.ranks.values() if g in t.groups), None)
        ranks = sorted(info.ranks) if info and info.ranks else sorted(r for r, cs in calls.items()
                                                                       if any(c.entry.group == g for c in cs))
        missing = [m for m in ranks if m not in ts.ranks]
        if missing:
            raise InputError(source, f"group {g!r} has member(s) {missing} that left no trace: every rank's dump "
                                     f"is needed to replay the run")
        members[g] = ranks
    for r, cs in calls.items():
        for c in cs:
            if c.entry.is_p2p and c.entry.peer not in ts.ranks:
                raise InputError(source, f"rank {r} {c.entry.op}s {'to' if c.entry.op == 'send' else 'from'} "
                                         f"rank {c.entry.peer}, which left no trace")
    cost = Cost()
    instances, trimmed = _collective_instances(calls, members)
    instances += _p2p_instances(calls)
    estimated = _assign_durations(instances, _kind_keys, cost)
    times = [t for cs in calls.values() for c in cs for t in (c.entry.t_created, c.entry.t_completed)
             if t is not None]
    t0 = min(times) if times else None
    ranks: dict[int, RankProgram] = {}
    p2p_n: dict[tuple, int] = {}
    for r, cs in calls.items():
        rp = RankProgram(streams={})
        by_thread: dict[str, list[Call]] = {}
        for c in cs:
            by_thread.setdefault(c.thread, []).append(c)
        for thread, tcs in by_thread.items():
            host = rp.streams.setdefault(f"host {thread}", [])
            prev = t0
            for what, t, c in _host_events(tcs):
                i = c.entry.index
                if what == "issue":
                    if t is not None and prev is not None and t > prev:
                        host.append(Op("compute", "", (t - prev) * 1e6))
                    host.append(Op("record", event=f"i{i}"))
                    started = c.entry.t_started
                    if c.entry.async_op and t is not None and started is not None and started > t:
                        host.append(Op("compute", "", (started - t) * 1e6))  # posting the async call
                        t = started
                else:
                    if what == "wait" and t is not None and prev is not None:
                        # the host computed until it called wait(); it then waited at most the transfer
                        gap = (t - prev) * 1e6 - (c.duration_us or 0.0)
                        if gap > 0:
                            host.append(Op("compute", "", gap))
                    host.append(Op("wait", event=f"d{i}"))
                if what == "return" and c.end is not None:
                    # the host is free when the transfer ends; the rest until it returned (scheduling, copies)
                    # is its own time: the next gap counts it
                    t = min(t, c.end) if t is not None else c.end
                if t is not None:
                    prev = t
        # communication streams take calls in issue order across the rank's threads
        order = sorted(cs, key=lambda c: (c.entry.t_created if c.entry.t_created is not None else 0.0,
                                          c.entry.index))
        for c in order:
            s = rp.streams.setdefault(_comm_stream(c.entry, r, streams), [])
            s += [Op("wait", event=f"i{c.entry.index}"), _comm_op(c, r, p2p_n),
                  Op("record", event=f"d{c.entry.index}")]
        if not rp.streams:
            rp.streams["host main"] = []
        ranks[r] = rp
    # Not `check_program`: the program is sound by construction, and a send nobody received is what a hung
    # run recorded — the replay shows it as the deadlock it was, not as bad input.
    prog = Program(groups=members, ranks=ranks, cost=cost, source=source,
                   eager_bytes=UNBOUNDED if eager_bytes is None else eager_bytes)
    recorded = (max(times) - t0) * 1e6 if times else None
    n_calls = sum(len(cs) for cs in calls.values())
    return Replay(prog, recorded, n_calls, estimated, skipped, trimmed, source, calls, _unfinished(ts))
