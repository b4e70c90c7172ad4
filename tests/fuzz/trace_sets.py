"""Generated trace sets: a tiny program run on a simulated world, with faults planted per rank, written as the
recorder or Flight Recorder would have left it.

A `Job` is one program (collectives on overlapping groups, p2p pairs) that every rank runs; each rank may carry
one fault: stop in Python before a step (a data loader), crash before a step (an exception), skip a step, swap
two steps, call a step with other metadata (size, dtype, root, op), call an extra collective on a group nobody
else uses, or leave no dump. `run` executes the ranks' calls with the communicators' rules (a collective
completes when every member has it at the head of its queue; a send and its recv complete together, or the send
at once when sends are eager), until nothing moves. Then `traces` writes what each rank's dump shows: every call
issued, completed or not; Gloo's late completion mark (a finished call shown in flight) where the job says so.
`ground_truth` tells which ranks are really blocked and which crashed - what the verdict must account for.

Written forms: the recorder's (`native`; without the calls a job issued from C++, `recorder_view`), a Flight
Recorder dump (pickle or JSON: `gloo:` names, `Float` dtypes, members in pg_config, no roots, a reduce_scatter
recorded as the all_reduce Gloo runs for it), or both of one rank (merged by the loader). `as_recorded` is what a
Flight Recorder dump keeps of a rank's calls. The calls block, as Gloo's do: named
`nccl:`, their order would read as NCCL's asynchronous one (trace/frontier.py), which these jobs do not have;
NCCL's semantics have their own generator (sim/fr_nccl.py, tests/fuzz/test_fuzz_nccl.py).
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from dataclasses import dataclass, field, replace

from hypothesis import strategies as st

from distdoctor.collectives.names import RECORDED_AS
from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_traces
from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, dumps

OPS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "scatter", "all_to_all")
ROOTED = ("broadcast", "scatter")
DTYPES = ("float32", "bfloat16", "int64")
FR_DTYPE = {"float32": "Float", "bfloat16": "BFloat16", "int64": "Long"}
FAULTS = ("none", "stop", "crash", "skip", "twice", "swap", "size", "dtype", "root", "op", "lone", "no_dump")
USER = "train.py"


@dataclass(frozen=True)
class Step:
    group: str
    op: str  # a collective, or "p2p"
    size: int = 8
    dtype: str = "float32"
    root: int | None = None
    src: int | None = None  # p2p
    dst: int | None = None
    cpp: bool = False  # issued from C++ (DDP's gradient buckets): in Flight Recorder's dump, not the recorder's
    half: str | None = None  # p2p: only the "send" (src's) or the "recv" (dst's) half, placed on its own


@dataclass
class Job:
    world: int
    groups: dict[str, list[int]]
    descs: dict[str, str]
    steps: list[Step]
    faults: dict[int, tuple[str, int]]  # rank -> (fault, step index)
    eager_sends: bool = False
    late: set[int] = field(default_factory=set)  # ranks whose last completed call is shown in flight (Gloo)
    flips: set[tuple[int, int]] = field(default_factory=set)  # (rank, call): the dump shows the other state
    crash_text: str = "RuntimeError: boom"  # what a crashed rank died of (a communication failure, or not)
    stale: set[int] = field(default_factory=set)  # ranks whose collectives never show completed (async, not waited)
    crash_where: tuple = ()  # frames (innermost last) a crashed rank's exception was raised in, below its own code
    crash_texts: dict = field(default_factory=dict)  # rank -> what it died of, where not `crash_text`
    async_sends: set[int] = field(default_factory=set)  # ranks whose sends return once issued and complete when
    # their recv is posted, waited for before the next receive (a batch of isends, then wait on each)


@st.composite
def jobs(draw, max_world: int = 8, faults=FAULTS, max_faults: int = 3, late: bool = True,
         noise: bool = False, stale: bool = False, cpp: bool = False) -> Job:
    """`noise`: the dumps also show a few calls in the wrong state (evidence that agrees with no execution).
    `stale`: some ranks (never all) show none of their collectives completed, as calls made with async_op=True
    whose Work nobody waited on. `cpp`: some collectives are issued from C++ (the recorder does not see them,
    its numbering counts fewer calls than the communicator's; `recorder_view`)."""
    world = draw(st.integers(1, max_world))
    groups = {"0": list(range(world))}
    descs = {"0": "default_pg"}
    for k in range(draw(st.integers(0, 3))):
        members = sorted(draw(st.sets(st.integers(0, world - 1), min_size=1, max_size=world)))
        groups[str(k + 1)] = members
        descs[str(k + 1)] = draw(st.sampled_from(["undefined", "", "mesh_dp", "mesh_tp", "metrics"]))
    steps = []
    for _ in range(draw(st.integers(1, 8))):
        g = draw(st.sampled_from(sorted(groups)))
        members = groups[g]
        if len(members) >= 2 and draw(st.integers(0, 4)) == 0:
            src, dst = draw(st.permutations(members))[:2]
            steps.append(Step(g, "p2p", draw(st.sampled_from([4, 8])), src=src, dst=dst))
            continue
        op = draw(st.sampled_from(OPS))
        steps.append(Step(g, op, draw(st.sampled_from([4, 8, 16])), draw(st.sampled_from(DTYPES)),
                          draw(st.sampled_from(members)) if op in ROOTED else None,
                          cpp=cpp and draw(st.integers(0, 2)) == 0))
    n_faults = draw(st.integers(0, min(max_faults, world)))
    chosen = draw(st.lists(st.integers(0, world - 1), min_size=n_faults, max_size=n_faults, unique=True))
    fault_map = {r: (draw(st.sampled_from(faults)), draw(st.integers(0, len(steps) - 1))) for r in chosen}
    late_ranks = set(draw(st.sets(st.integers(0, world - 1), max_size=2))) if late else set()
    flips = set(draw(st.sets(st.tuples(st.integers(0, world - 1), st.integers(0, len(steps))), max_size=3))) \
        if noise else set()
    crash_text = draw(st.sampled_from(["RuntimeError: boom", "ValueError: bad shape [8] vs [4]",
                                       "RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:4515"]))
    stale_ranks = set(draw(st.sets(st.integers(0, world - 1), max_size=world - 1))) if stale else set()
    return Job(world, groups, descs, steps, fault_map, draw(st.booleans()), late_ranks, flips, crash_text,
               stale_ranks)


# ---- running the program -----------------------------------------------------------------------------------

@dataclass
class Call:
    group: str
    op: str  # collective name, "send" or "recv"
    size: int
    dtype: str
    root: int | None = None
    peer: int | None = None
    line: int = 0  # the user's line it was called from
    done: bool = False
    out_size: int | None = None  # all_to_all: the output buffer's own size, when a fault changed the input only


def calls_of(job: Job, rank: int) -> tuple[list[Call], str]:
    """The calls rank makes (its program with its fault applied) and how it ends: 'stop', 'crash' or 'done'."""
    fault, at = job.faults.get(rank, ("none", 0))
    steps = list(enumerate(job.steps))
    if fault == "swap" and at + 1 < len(steps):
        steps[at], steps[at + 1] = steps[at + 1], steps[at]
    out: list[Call] = []
    end = "done"
    for i, (k, s) in enumerate(steps):
        if fault in ("stop", "crash") and i == at:
            end = fault
            break
        if fault == "skip" and i == at:
            continue
        if fault == "lone" and i == at:
            out.append(Call("lone", "all_reduce", 1, "float32", line=900))
        line = 100 + k
        if s.op == "p2p":
            if rank in (s.src, s.dst) and s.half in (None, "send" if rank == s.src else "recv"):
                mine = Call(s.group, "send" if rank == s.src else "recv", s.size, s.dtype,
                            peer=s.dst if rank == s.src else s.src, line=line)
                if fault in ("message_size", "message_dtype") and i == at:  # another message than the peer expects
                    mine.size = mine.size * 2 if fault == "message_size" else mine.size
                    mine.dtype = ("int64" if mine.dtype != "int64" else "float32") if fault == "message_dtype" \
                        else mine.dtype
                if fault == "peer" and i == at:  # the peer computed wrong: the next rank over
                    mine.peer = next(p for p in range(mine.peer + 1, mine.peer + job.world + 1)
                                     if p % job.world not in (rank, mine.peer)) % job.world
                out += [mine, replace(mine)] if fault == "twice" and i == at else [mine]
            continue
        if rank not in job.groups[s.group]:
            continue
        size, dtype, root, op = s.size, s.dtype, s.root, s.op
        if i == at:
            size = size * 2 if fault == "size" else size
            dtype = "int64" if fault == "dtype" and dtype != "int64" else ("float32" if fault == "dtype" else dtype)
            root = (root + 1) % job.world if fault == "root" and root is not None else root
            op = ("all_gather" if op != "all_gather" else "all_reduce") if fault == "op" else op
        # all_to_all's output is a buffer of its own: a resized call changes the input the rank passes
        out_size = s.size if op == "all_to_all" and size != s.size else None
        out.append(Call(s.group, op, size, dtype, root, line=line, out_size=out_size))
        if fault == "twice" and i == at:  # the same call once more: the peers take it for their next one
            out.append(replace(out[-1]))
    return out, end


def run(job: Job) -> dict[int, tuple[list[Call], int, str]]:
    """rank -> (calls, how many it issued, end): executes every rank's calls until nothing moves."""
    groups = dict(job.groups, lone=[])
    prog = {r: calls_of(job, r) for r in range(job.world)}
    for r, (calls, _) in prog.items():
        if any(c.group == "lone" for c in calls):
            groups["lone"] = sorted(set(groups["lone"]) | {r})
    head = {r: 0 for r in prog}
    batch: set[int] = set()  # ranks waiting for their batch of sends, the next call not yet issued

    def in_batch(r: int) -> bool:
        calls, i = prog[r][0], head[r]
        return r in job.async_sends and i < len(calls) and calls[i].op == "recv" and any(
            x.op == "send" and not x.done for x in calls[:i])
    seq_of: dict[tuple[int, int], int] = {}  # (rank, call index) -> group seq
    for r, (calls, _) in prog.items():
        count: dict[str, int] = {}
        for i, c in enumerate(calls):
            if c.op not in ("send", "recv"):
                count[c.group] = count.get(c.group, 0) + 1
                seq_of[(r, i)] = count[c.group]
    moved = True
    while moved:
        moved = False
        for r, (calls, _) in prog.items():
            i = head[r]
            if i >= len(calls):
                continue
            c = calls[i]
            if c.op == "send" and (job.eager_sends or r in job.async_sends):
                c.done, head[r], moved = job.eager_sends, i + 1, True
                continue
            if in_batch(r):
                batch.add(r)  # waits for its batch of sends before it posts the next receive
                continue
            batch.discard(r)
            if c.op == "recv" and c.peer in job.async_sends:  # its sender issued its sends and went on
                sends = [x for x in prog[c.peer][0][:head[c.peer]] if x.op == "send" and x.peer == r
                         and x.group == c.group]
                mine = [x for x in calls[:i] if x.op == "recv" and x.peer == c.peer and x.group == c.group]
                if len(sends) > len(mine):
                    c.done = sends[len(mine)].done = True
                    head[r], moved = i + 1, True
                continue
            if c.op in ("send", "recv"):
                other = prog[c.peer][0]
                j = head[c.peer]
                want = "recv" if c.op == "send" else "send"
                if c.op == "recv" and job.eager_sends:
                    sent = [x for x in other if x.op == "send" and x.peer == r and x.group == c.group and x.done]
                    mine = [x for x in calls[:i] if x.op == "recv" and x.peer == c.peer and x.group == c.group]
                    if len(sent) > len(mine):
                        c.done, head[r], moved = True, i + 1, True
                    continue
                if j < len(other) and other[j].op == want and other[j].peer == r and other[j].group == c.group \
                        and not in_batch(c.peer):
                    c.done = other[j].done = True
                    head[r], head[c.peer], moved = i + 1, j + 1, True
                continue
            members = groups[c.group] if c.group != "lone" else [r]
            heads = []
            for m in members:
                mc = prog[m][0]
                if head[m] >= len(mc) or mc[head[m]].group != c.group or mc[head[m]].op in ("send", "recv") or \
                        seq_of[(m, head[m])] != seq_of[(r, i)]:
                    break
                heads.append(m)
            else:
                if c.group == "lone" and len(job.groups["0"]) > 1:
                    continue  # a collective nobody else calls never completes
                for m in heads:
                    prog[m][0][head[m]].done = True
                    head[m] += 1
                moved = True
    return {r: (calls, head[r] + (1 if head[r] < len(calls) and r not in batch else 0), end)
            for r, (calls, end) in prog.items()}


def finished(ran: dict) -> set[int]:
    """The ranks that issued and completed every call of their program (a real one would exit; the generator
    keeps it idle in the user's code)."""
    return {r for r, (calls, issued, _) in ran.items() if issued >= len(calls) and all(c.done for c in calls)}


def ground_truth(job: Job, ran: dict) -> tuple[set[int], set[int]]:
    """(ranks really blocked in a call at dump time, ranks that crashed) among the ranks that left a dump."""
    blocked, crashed = set(), set()
    for r, (calls, issued, end) in ran.items():
        if job.faults.get(r, ("none",))[0] == "no_dump":
            continue
        if end == "crash" and issued >= len(calls) and all(c.done for c in calls):
            crashed.add(r)
        elif issued and not calls[issued - 1].done:
            blocked.add(r)
    return blocked, crashed


# ---- writing what each rank's dump shows --------------------------------------------------------------------

def traces(job: Job, ran: dict) -> dict[int, RankTrace]:
    """The recorder's view of every rank that left a dump."""
    groups = dict(job.groups)
    lone = sorted({r for r, (calls, _, _) in ran.items() if any(c.group == "lone" for c in calls)})
    if lone:
        groups["lone"] = list(range(job.world))  # made with new_group on every rank; used by some
    out = {}
    for r, (calls, issued, end) in ran.items():
        if job.faults.get(r, ("none",))[0] == "no_dump":
            continue
        entries, seqs, p2p = [], {}, {}
        reached = issued >= len(calls) and all(c.done for c in calls)  # got to where its fault stops it
        for i, c in enumerate(calls[:issued]):
            t = 1000.0 + (c.line - 100) * 0.01  # one clock: the same step at the same time on every rank
            state = "completed" if c.done else "started"
            if r in job.late and c.done and i == issued - 1 and c.op not in ("send", "recv"):
                state = "started"  # Gloo marks it completed a moment after the call returned
            if r in job.stale and c.op not in ("send", "recv"):
                state = "started"  # an async collective whose Work was never waited on
            if (r, i) in job.flips:
                state = "started" if state == "completed" else "completed"
            frames = [Frame("<module>", USER, 1), Frame("step", USER, c.line)]
            if c.op in ("send", "recv"):
                key = (c.group, c.op, c.peer)
                p2p[key] = p2p.get(key, 0) + 1
                entries.append(Entry(index=i, group=c.group, op=c.op, p2p_seq=p2p[key], raw_op=c.op, peer=c.peer,
                                     in_sizes=[[c.size]] if c.op == "send" else [],
                                     out_sizes=[[c.size]] if c.op == "recv" else [],
                                     in_dtypes=[c.dtype] if c.op == "send" else [],
                                     out_dtypes=[c.dtype] if c.op == "recv" else [], state=state, t_created=t,
                                     stream="MainThread", frames=frames))
                continue
            seqs[c.group] = seqs.get(c.group, 0) + 1
            n = len(groups[c.group])
            ins, outs = _sizes(c.op, c.size, n, c.root == r)
            if c.out_size is not None:
                outs = [[c.out_size]]
            entries.append(Entry(index=i, group=c.group, op=c.op, seq=seqs[c.group], raw_op=c.op, in_sizes=ins,
                                 out_sizes=outs, in_dtypes=[c.dtype] * len(ins),
                                 out_dtypes=[c.dtype] * len(outs), root=c.root, state=state, t_created=t,
                                 stream="MainThread", frames=frames))
        now = [Frame("<module>", USER, 1), Frame("load_batch", "data.py", 7)] if end == "stop" and reached else \
            [Frame("<module>", USER, 1), Frame("step", USER, calls[issued - 1].line if issued else 1)]
        if issued and not calls[issued - 1].done and _from_cpp(job, calls[issued - 1]):
            now.append(TORCH_FRAME)  # in a call issued from C++: inside torch (DDP's backward hook)
        stacks = {"MainThread (1)": now}
        reason = "hang"
        if end == "crash" and reached:
            reason = f"exception: {job.crash_texts.get(r, job.crash_text)}"
            raised = [Frame("<module>", USER, 1), Frame("forward", "model.py", 3), *job.crash_where]
            stacks = {"exception in MainThread": raised, "MainThread (1)": list(raised)}
        out[r] = RankTrace(rank=r, source="native", world_size=job.world, entries=entries, stacks=stacks,
                           groups={g: GroupInfo(g, m, False, job.descs.get(g, "")) for g, m in groups.items()
                                   if r in m},
                           dump_reason=reason, dump_time=2000.0)
    return out


TORCH_FRAME = Frame("_engine_run_backward", "/usr/lib/python3/site-packages/torch/autograd/graph.py", 825)


def _from_cpp(job: Job, call: Call) -> bool:
    k = call.line - 100
    return 0 <= k < len(job.steps) and job.steps[k].cpp


def recorder_view(job: Job, trace: RankTrace) -> RankTrace:
    """What the recorder saw of the rank: no call issued from C++, collectives numbered among the rest."""
    seqs: dict[str, int] = {}
    entries = []
    for e in trace.entries:
        k = e.frames[-1].line - 100 if e.frames else -1  # a JSON form's reference keeps no stacks (as_recorded)
        if 0 <= k < len(job.steps) and job.steps[k].cpp:
            continue  # issued from C++: the recorder never saw it
        if e.seq is not None:
            seqs[e.group] = seqs.get(e.group, 0) + 1
            e = replace(e, seq=seqs[e.group])
        entries.append(replace(e, index=len(entries)))
    return replace(trace, entries=entries)


def _sizes(op: str, size: int, n: int, is_root: bool = False) -> tuple[list, list]:
    if op == "barrier":
        return [], []
    if op == "scatter":  # the root passes one tensor per member (scatter_list), the others none
        return [[size]] * n if is_root else [], [[size]]
    if op == "all_gather":
        return [[size]], [[size * n]]
    if op == "reduce_scatter":
        return [[size * n]], [[size]]
    return [[size]], [[size]]


def as_recorded(trace: RankTrace, frames: bool = True) -> RankTrace:
    """The rank's calls as Gloo's Flight Recorder records them, in the recorder's form: no roots, `gloo:` names,
    and a reduce_scatter as the all_reduce Gloo runs for it (of the whole input: collectives/names.RECORDED_AS,
    checked on torch 2.13); no stacks with `frames=False` (the JSON form). What a dump of the rank can tell, and
    nothing more."""
    entries = []
    for e in trace.entries:
        op = RECORDED_AS["gloo"].get(e.op, e.op)
        sizes = {"out_sizes": e.in_sizes, "out_dtypes": e.in_dtypes} if op != e.op else {}
        if not frames:
            sizes["frames"] = []
        entries.append(replace(e, op=op, raw_op=f"gloo:{op}", root=None, **sizes))
    return replace(trace, entries=entries)


def fr_dump(trace: RankTrace, groups: dict[str, list[int]], frames: bool = False, p2p: bool = True,
            listed: bool = True) -> dict:
    """The Flight Recorder dump of the same calls: `gloo:` names (the calls block), C++ dtype names, no roots, members
    in pg_config, group-local p2p peers in the profiling name; each call's stack with `frames` (the pickle).
    `p2p=False`: as torch's Flight Recorder over Gloo writes it, with no send/recv at all. `listed=False`: as
    Gloo's writes it too, a pg_config that lists no group (the groups are named by the entries alone, with the
    description the trace gives them)."""
    entries = []
    p2p_seq: dict[str, int] = {}
    for i, e in enumerate(as_recorded(trace).entries):
        members = groups.get(e.group, [])
        if e.is_p2p and not p2p:
            continue
        if e.is_p2p:
            p2p_seq[e.group] = p2p_seq.get(e.group, 0) + 1
            me, peer = members.index(trace.rank), members.index(e.peer)
            name = f"gloo:send {me}->{peer}" if e.op == "send" else f"gloo:recv {me}<-{peer}"
        else:
            name = f"gloo:{e.op}"
        desc = _fr_desc(trace, e.group)
        entries.append({
            "record_id": i, "process_group": [e.group, desc],
            "collective_seq_id": 0 if e.is_p2p else e.seq, "p2p_seq_id": p2p_seq.get(e.group, 0) if e.is_p2p else 0,
            "is_p2p": e.is_p2p, "profiling_name": name, "time_created_ns": int(e.t_created * 1e9) + 1000,
            "input_sizes": e.in_sizes, "output_sizes": e.out_sizes,
            "input_dtypes": [FR_DTYPE.get(d, d) for d in e.in_dtypes],
            "output_dtypes": [FR_DTYPE.get(d, d) for d in e.out_dtypes],
            "state": "completed" if e.state == "completed" else "started", "retired": e.state == "completed",
            "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0, "thread_name": "pt_main",
            # the Python stack of the call, innermost first (the JSON form has none)
            **({"frames": [{"name": f.name, "filename": f.filename, "line": f.line} for f in reversed(e.frames)]}
               if frames else {})})
    pg_config = {g: {"name": g, "desc": _fr_desc(trace, g), "ranks": json.dumps(m)}
                 for g, m in groups.items() if trace.rank in m}
    if not listed:
        pg_config = {"": {"name": "", "desc": "", "ranks": "[]"}}
    return {"version": "2.10", "rank": trace.rank, "pg_config": pg_config, "pg_status": {}, "entries": entries,
            "comm_lib_version": ""}  # as Gloo's dumps say it


def _fr_desc(trace: RankTrace, group: str) -> str:
    """The group's description as Flight Recorder records it: torch's group_desc (a DeviceMesh dimension's name,
    `default_pg`), `undefined` where the job gave none."""
    info = trace.groups.get(group)
    return (info.desc if info is not None and info.desc else "") or ("default_pg" if group == "0" else "undefined")


def write(directory: str, job: Job, ts: dict[int, RankTrace], forms: dict[int, str], p2p: bool = True,
          listed: bool = True) -> None:
    """Each rank's dump in its form: native, pickle, json, or both (native + pickle); `p2p=False`: the Flight
    Recorder forms hold no send/recv, as Gloo's do not; `listed=False`: their pg_config lists no group's members,
    as Gloo's does not."""
    groups = dict(job.groups)
    if any("lone" in t.groups for t in ts.values()):
        groups["lone"] = list(range(job.world))
    for r, t in ts.items():
        form = forms.get(r, "native")
        if form in ("native", "both"):
            with open(os.path.join(directory, f"rank_{r}.jsonl"), "w") as f:
                f.write(dumps(recorder_view(job, t)))
        if form in ("pickle", "both"):
            with open(os.path.join(directory, f"rank_{r}.fr.pkl"), "wb") as f:
                pickle.dump(fr_dump(t, groups, frames=True, p2p=p2p, listed=listed), f)
        if form == "json":
            with open(os.path.join(directory, f"fr_rank_{r}.json"), "w") as f:
                json.dump(fr_dump(t, groups, p2p=p2p, listed=listed), f)


def analyzed(job: Job, ts: dict[int, RankTrace], forms: dict[int, str], **how):
    """diagnose's report of these traces, each written in its form (`write`'s keywords in `how`), loaded for a world
    of the job's size: no load error."""
    with tempfile.TemporaryDirectory() as d:
        write(d, job, ts, forms, **how)
        loaded = load_traces([d], world_size=job.world)
    assert loaded.errors == [], loaded.errors
    return analyze(loaded)


def blocking_call(i: int, op: str, done: bool = True, *, group: str = "0", seq: int | None = None,
                  line: int | None = None, func: str = "step", size: int = 8, out_size: int | None = None,
                  start: float | None = None, end: float | None = None, error: str | None = None) -> Entry:
    """A rank's i-th call as the recorder records a blocking one: collective `seq` (i + 1) of `group`, called
    from `func` at `line` (100 + i) of the user's file, issued at `start` (1000 + i) and, `done`, completed at
    `end` (half a second later), else in flight (with the `error` it failed of, if any); a broadcast is rooted
    at rank 0."""
    start = 1000.0 + i if start is None else start
    return Entry(index=i, group=group, op=op, seq=i + 1 if seq is None else seq, raw_op=op, in_sizes=[[size]],
                 out_sizes=[[size if out_size is None else out_size]], in_dtypes=["float32"], out_dtypes=["float32"],
                 root=0 if op == "broadcast" else None, state="completed" if done else "started", t_created=start,
                 t_started=start, t_completed=(start + 0.5 if end is None else end) if done else None,
                 stream="MainThread", frames=[Frame(func, USER, 100 + i if line is None else line)], error=error)


def with_frontier(trace: RankTrace, groups: dict[str, list[int]], completed: dict[str, int] | None = None) -> RankTrace:
    """The trace with its communicator's frontier in its header (`pg_status`, `pg_names`: recorder/dumpfile.py
    fr_standing), from its calls as Flight Recorder numbers them (every call, C++'s included): per group the
    last it issued, and the last completed (`completed` overrides: Gloo retires a failed call as completed)."""
    status, names = {}, {}
    for pg_id, g in enumerate(sorted((g for g, m in groups.items() if trace.rank in m), key=int)):
        calls = [e for e in trace.entries if e.group == g and e.seq is not None]
        done = max((e.seq for e in calls if e.state == "completed"), default=0)
        status[str(pg_id)] = (max((e.seq for e in calls), default=0), None, (completed or {}).get(g, done))
        names[str(pg_id)] = g
    return replace(trace, pg_status=status, pg_names=names)


# ---- calls issued from C++: the recorder sees only the Python ones ------------------------------------------

PEER_CLOSED = ("RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:20916. This is typically caused "
               "by a remote worker crashing.")


@st.composite
def crash_under_hidden_calls(draw) -> tuple[dict[int, RankTrace], int]:
    """(the recorder's traces of every rank, the rank that raised): a job whose collectives are mostly issued from
    C++ (DDP, DCP): the recorder's own entries number only the `seen` calls Python made, while its watchdog's hang
    header names the call each rank was blocked in by Flight Recorder's numbering (`k` of them so far). One rank
    raised on its own before call #k; the others are blocked in #k, or in #k + 1 where they finished #k before the
    loss reached them (a broadcast's root has sent its part), and then die of the closed connection or the
    launcher's SIGTERM. What Flight Recorder saw is gone with its dumps: only the recorder's traces are read."""
    world = draw(st.integers(3, 8))
    seen = draw(st.integers(1, 4))
    k = seen + draw(st.integers(1, 6))  # the calls from C++ lie between
    culprit = draw(st.integers(0, world - 1))
    ahead = draw(st.sets(st.sampled_from([r for r in range(world) if r != culprit]), max_size=world - 2))
    out = {}
    for r in range(world):
        entries = [Entry(index=i, group="0", op="broadcast", seq=i + 1, raw_op="broadcast", in_sizes=[[8]],
                         out_sizes=[[8]], in_dtypes=["float32"], out_dtypes=["float32"], root=0, state="completed",
                         t_created=1000.0 + i, stream="MainThread", frames=[Frame("step", USER, 100 + i)])
                   for i in range(seen)]
        t = RankTrace(rank=r, source="native", world_size=world, entries=entries,
                      groups={"0": GroupInfo("0", list(range(world)), False, "default_pg")},
                      stacks={"MainThread (1)": [Frame("<module>", USER, 1), Frame("step", USER, 200)]},
                      dump_time=1010.0 + r * 0.01)
        if r == culprit:
            t.dump_reason, t.dump_time = "exception: RuntimeError: boom", 1005.0
            t.exception = {"type": "RuntimeError", "message": "boom", "thread": "MainThread",
                           "where": f"step ({USER}:201)", "exit_code": 1}
            out[r] = t
            continue
        call = {"group": "0", "seq": k + (r in ahead), "op": "broadcast", "source": "flight_recorder",
                "since": 1004.0}
        t.hang = {"status": draw(st.sampled_from(["suspected", "confirmed"])), "detected_at": 1007.0,
                  "since": 1004.0, "blocked_in": call, "this_rank": {"blocked_in": call, "blocked_for_s": 5.0}}
        if draw(st.booleans()):
            kind, _, message = PEER_CLOSED.partition(": ")
            t.dump_reason = f"exception: {PEER_CLOSED}"
            t.exception = {"type": kind, "message": message, "thread": "MainThread",
                           "where": f"step ({USER}:200)", "exit_code": 1}
        else:
            t.dump_reason = "signal: SIGTERM"
        out[r] = t
    return out, culprit


@st.composite
def cycle_among_victims(draw) -> tuple[dict[int, RankTrace], int]:
    """(the recorder's traces, the rank that raised): two ranks blocked in collectives of two groups in opposite
    orders, each call also waiting for a third member that raised on its own before either: whatever the order,
    neither call could complete; the two then die of the closed connection or the launcher's SIGTERM."""
    world = draw(st.integers(3, 6))
    c, a, b = draw(st.permutations(range(world)))[:3]
    members = sorted((a, b, c))
    out = {}
    for r in range(world):
        entries = [Entry(index=0, group="0", op="all_reduce", seq=1, raw_op="all_reduce", in_sizes=[[8]],
                         out_sizes=[[8]], in_dtypes=["float32"], out_dtypes=["float32"], state="completed",
                         t_created=1000.0, stream="MainThread", frames=[Frame("step", USER, 100)])]
        if r in (a, b):
            g = "1" if r == a else "2"
            entries.append(Entry(index=1, group=g, op="all_reduce", seq=1, raw_op="all_reduce", in_sizes=[[8]],
                                 out_sizes=[[8]], in_dtypes=["float32"], out_dtypes=["float32"], state="started",
                                 t_created=1001.0, stream="MainThread", frames=[Frame("step", USER, 101)]))
        t = RankTrace(rank=r, source="native", world_size=world, entries=entries,
                      groups={"0": GroupInfo("0", list(range(world)), False, "default_pg"),
                              **({g: GroupInfo(g, members, False, "") for g in ("1", "2")} if r in members else {})},
                      stacks={"MainThread (1)": [Frame("<module>", USER, 1), Frame("step", USER, 200)]},
                      dump_reason="signal: SIGTERM", dump_time=1010.0)
        if r == c:
            t.dump_reason, t.dump_time = "exception: ValueError: bad batch", 1000.5
            t.exception = {"type": "ValueError", "message": "bad batch", "thread": "MainThread",
                           "where": f"step ({USER}:201)", "exit_code": 1}
        elif r in (a, b) and draw(st.booleans()):
            kind, _, message = PEER_CLOSED.partition(": ")
            t.dump_reason = f"exception: {PEER_CLOSED}"
            t.exception = {"type": kind, "message": message, "thread": "MainThread",
                           "where": f"step ({USER}:101)", "exit_code": 1}
        out[r] = t
    return out, c


def pipeline_rounds(world: int, rounds: int) -> list[Step]:
    """A pipeline's steps: each round the activations forward, stage to stage, then the gradients back."""
    steps = []
    for _ in range(rounds):
        steps += [Step("0", "p2p", 8, src=i, dst=i + 1) for i in range(world - 1)]
        steps += [Step("0", "p2p", 8, src=i + 1, dst=i) for i in reversed(range(world - 1))]
    return steps


def pipeline_gpipe(world: int, microbatches: list[int], batched: list[bool] | None = None) -> list[Step]:
    """A GPipe pipeline's steps, a step's micro-batch count its own (the fuzz jobs' pipeline: 1, 2, then 4):
    every micro-batch's activations forward, stage to stage, then every one's gradients back; a batched step's
    stages receive all of a phase's messages before they send them on (the fuzz jobs' second step)."""
    steps = []
    for m, whole in zip(microbatches, batched or [False] * len(microbatches)):
        if whole:
            steps += [Step("0", "p2p", 8, src=i, dst=i + 1) for i in range(world - 1) for _ in range(m)]
            steps += [Step("0", "p2p", 8, src=i + 1, dst=i) for i in reversed(range(world - 1)) for _ in range(m)]
            continue
        steps += [Step("0", "p2p", 8, src=i, dst=i + 1) for _ in range(m) for i in range(world - 1)]
        steps += [Step("0", "p2p", 8, src=i + 1, dst=i) for _ in range(m) for i in reversed(range(world - 1))]
    return steps


def pipeline_1f1b(world: int, microbatches: int, rounds: int) -> list[Step]:
    """A 1F1B pipeline's steps, each stage's sends and receives as halves of their own (a job with eager sends:
    no blocking order exists in which each send meets its recv, which is why schedules batch them): stage s
    warms up with min(n, world - s - 1) forwards, then alternates one forward and one backward, then cools down;
    its program differs stage by stage (a staircase of warm-ups)."""
    def program(s: int) -> list[tuple[str, int]]:
        warm = min(microbatches, world - s - 1)
        phases = ["F"] * warm + [x for _ in range(microbatches - warm) for x in ("F", "B")] + ["B"] * warm
        ops = []
        for phase in phases:
            if phase == "F":
                ops += ([("recv", s - 1)] if s > 0 else []) + ([("send", s + 1)] if s < world - 1 else [])
            else:
                ops += ([("recv", s + 1)] if s < world - 1 else []) + ([("send", s - 1)] if s > 0 else [])
        return ops * rounds

    progs = {s: program(s) for s in range(world)}
    steps = []
    for i in range(max(map(len, progs.values()))):
        for s, ops in progs.items():
            if i < len(ops):
                op, peer = ops[i]
                src, dst = (s, peer) if op == "send" else (peer, s)
                steps.append(Step("0", "p2p", 8, src=src, dst=dst, half=op))
    return steps


@st.composite
def pipeline_left(draw) -> tuple[Job, int, dict[int, str]]:
    """(a pipeline job, the rank that left it, each rank's dump form): stages pass activations forward and
    gradients back with send/recv only; one rank exits mid-way with its process group alive (its recorder dump:
    `exit: normal exit`, no destroy_process_group); each other rank left the recorder's trace or Gloo's Flight
    Recorder dump (pickle or JSON), which records no send/recv."""
    world = draw(st.integers(3, 6))
    steps = pipeline_rounds(world, draw(st.integers(1, 3)))
    left = draw(st.integers(0, world - 1))
    job = Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps,
              {left: ("stop", draw(st.integers(1, len(steps) - 1)))})
    forms = {r: "native" if r == left else draw(st.sampled_from(["native", "pickle", "json"])) for r in range(world)}
    return job, left, forms


@st.composite
def pipeline_deviated(draw) -> tuple[Job, int, int]:
    """(a pipeline job of several rounds, the rank whose send or recv goes wrong, the round it goes wrong in):
    one of its p2p calls skipped, issued twice, or to the wrong peer; every rank leaves the recorder's trace."""
    world = draw(st.integers(3, 6))
    steps = pipeline_rounds(world, draw(st.integers(3, 6)))
    per_round = 2 * (world - 1)
    bad = draw(st.integers(0, world - 1))
    mine = [i for i, s in enumerate(steps) if bad in (s.src, s.dst)]
    at = draw(st.sampled_from(mine))
    return Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps,
               {bad: (draw(st.sampled_from(["skip", "twice", "peer"])), at)}), bad, at // per_round


@st.composite
def pipeline_gpipe_deviated(draw) -> tuple[Job, int, str]:
    """(a GPipe job whose first steps carry growing micro-batch counts and the rest one count (a count that
    changes at will would make a stage's steady rounds no evidence: the rounds rule rests on them), each warm-up
    step and the steady ones passing micro-batches on one at a time or a phase at once, the rank whose send or
    recv goes wrong, the fault): any stage, first and last included, at any of its calls; sends meet their
    receives, complete into a buffer, or, on every stage or on the end stages only (the campaign's pipeline: its
    end stages post a step's sends at once), return once issued and complete when their receive is posted."""
    world = draw(st.integers(2, 6))
    warm = sorted(draw(st.sets(st.integers(1, 3), max_size=3)))  # growing counts first (the campaign's 1, 2)
    steady = draw(st.integers(max(warm, default=0) + 1, 5))  # then one count, step after step
    micro = warm + [steady] * draw(st.integers(1, 3))
    whole = [draw(st.booleans()) for _ in warm] + [draw(st.booleans())] * (len(micro) - len(warm))
    steps = pipeline_gpipe(world, micro, whole)
    bad = draw(st.integers(0, world - 1))
    mine = [i for i, s in enumerate(steps) if bad in (s.src, s.dst)]
    fault = draw(st.sampled_from(["skip", "twice", "peer"] if world > 2 else ["skip", "twice"]))
    sends = draw(st.sampled_from(["rendezvous", "eager", "async", "async ends"]))
    batched = set(range(world)) if sends == "async" else {0, world - 1} if sends == "async ends" else set()
    return Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps,
               {bad: (fault, draw(st.sampled_from(mine)))}, eager_sends=sends == "eager",
               async_sends=batched), bad, fault


@st.composite
def pipeline_1f1b_deviated(draw) -> tuple[Job, int]:
    """(a 1F1B pipeline job, the rank whose send or recv goes wrong): the stages' programs differ by design, so
    no stage's calls are read against another's (p2p_roles.py) but where the role holds."""
    world = draw(st.integers(4, 8))
    steps = pipeline_1f1b(world, draw(st.integers(2, 5)), draw(st.integers(1, 3)))
    bad = draw(st.integers(0, world - 1))
    mine = [i for i, s in enumerate(steps) if bad == (s.src if s.half == "send" else s.dst)]
    return Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps,
               {bad: (draw(st.sampled_from(["skip", "twice", "peer", "stop"])), draw(st.sampled_from(mine)))},
               eager_sends=True), bad


@st.composite
def pipeline_odd_message(draw) -> tuple[Job, int, int, str]:
    """(a pipeline job of several rounds, the rank that sends its peer a message of another size or dtype, that
    peer, the fault): Gloo aborts the peer as it receives it (it stops there and leaves no dump)."""
    world = draw(st.integers(2, 6))
    steps = pipeline_rounds(world, draw(st.integers(3, 5)))
    at = draw(st.integers(4 * (world - 1), len(steps) - 1))  # after two rounds: the usual message is known
    sender, receiver = steps[at].src, steps[at].dst
    fault = draw(st.sampled_from(["message_size", "message_dtype"]))
    return Job(world, {"0": list(range(world))}, {"0": "default_pg"}, steps,
               {sender: (fault, at), receiver: ("stop", at)}), sender, receiver, fault


@st.composite
def pipeline_odd_half(draw) -> tuple[Job, int, str]:
    """(a pipeline job of several rounds, the rank whose send, or recv, of one pair carries another size or dtype
    than its peer's half, the fault): both ranks go on and leave their dumps."""
    job, sender, receiver, fault = draw(pipeline_odd_message())
    at = job.faults[sender][1]
    odd = draw(st.sampled_from([sender, receiver]))
    return replace(job, faults={odd: (fault, at)}), odd, fault


@st.composite
def pipeline_stopped(draw) -> tuple[Job, int, dict[int, str], float, bool]:
    """(a pipeline job, the rank that stopped in Python mid-way (a data loader, a sleep), each rank's form, how long
    its own watchdog had seen it in no call when the ranks dumped: past the hang's threshold, when a watchdog
    confirmed the hang and the run stopped the job; or 0, when a signal caught the job before any watchdog
    called it hung; whether the headers number the call the hang's detector was blocked in (a call the
    recorder saw without its group's sequence number has none)). The other ranks wait in send/recv along the
    chain to it, through ranks whose Gloo dumps cannot show p2p, or finished and left."""
    job, stopped, _ = draw(pipeline_left())
    forms = {r: draw(st.sampled_from(["native", "native", "pickle", "json"])) for r in range(job.world)}
    return job, stopped, forms, draw(st.sampled_from([0.0, HANG_THRESHOLD_S + 2.0, 31.0])), draw(st.booleans())


HANG_THRESHOLD_S = 10.0


def dumped_for_hang(trace: RankTrace, idle_for: float, hung: bool, done: bool = False,
                    episode: dict | None = None) -> RankTrace:
    """The recorder's dump of a rank when a signal stopped the job: after its watchdog confirmed a hang (`hung`:
    the call it saw the rank blocked in, or none and how long it had been in none, `idle_for`; `episode`: the
    hang's detector and the call it was blocked in, as each header records them), or before any did. A rank
    whose program was `done` dumped at its exit, after destroy_process_group."""
    if done:
        return replace(trace, dump_reason="exit: normal exit (destroy_process_group called)", hang=None)
    if not hung:
        return replace(trace, dump_reason="signal: SIGTERM", hang=None)
    blocked = blocked_call(trace)
    mine = {"blocked_in": blocked, "blocked_for_s": None if blocked is None else 31.0,
            "idle_for_s": idle_for if blocked is None else 31.0}
    return replace(trace, dump_reason="signal: SIGTERM", hang={
        "status": "confirmed", "threshold_s": HANG_THRESHOLD_S, "hang_timeout_s": 30.0, "this_rank": mine,
        **(episode or {})})


def blocked_call(trace: RankTrace) -> dict | None:
    """The call a rank's watchdog saw it blocked in: its first call not completed, as a header records it."""
    pending = next((e for e in trace.entries if e.state != "completed"), None)
    return None if pending is None else {
        "group": pending.group, "seq": pending.p2p_seq if pending.is_p2p else pending.seq, "op": pending.op,
        "source": "recorder", "since": pending.t_created}


def left_alive(trace: RankTrace) -> RankTrace:
    """The dump the recorder's exit hook leaves of a rank that exited with its process group alive."""
    return replace(trace, dump_reason="exit: normal exit", stacks={})


@st.composite
def pipeline_closed(draw) -> tuple[Job, int, dict[int, str], set[int], bool]:
    """(a pipeline job, the rank that ended, each rank's form, the ranks that died of the closed connection, whether
    a watchdog called the job hung): the rank that ended left Gloo's Flight Recorder dump (no send/recv, empty); a
    neighbour blocked in a send/recv with it may die of "Connection closed by peer" (it saw the rank end); the
    other ranks' dumps come later, those blocked still blocked (alive then, and so their peers)."""
    job, left, _ = draw(pipeline_left())
    forms = {r: draw(st.sampled_from(["native", "native", "pickle", "json"])) for r in range(job.world)}
    forms[left] = draw(st.sampled_from(["pickle", "json"]))
    closing = {r for r in (left - 1, left + 1) if 0 <= r < job.world and draw(st.booleans())}
    return job, left, forms, closing, draw(st.booleans())


def closed_under(trace: RankTrace, when: float) -> RankTrace:
    """The recorder's dump of a rank that died of its peer's closed connection, where it waited."""
    kind, _, message = PEER_CLOSED.partition(": ")
    return replace(trace, dump_reason=f"exception: {PEER_CLOSED}", dump_time=when,
                   exception={"type": kind, "message": message, "thread": "MainThread",
                              "where": f"step ({USER}:200)", "exit_code": 1})


# ---- the launcher's console log: how each rank ended ---------------------------------------------------------

LAUNCH_ENDS = ("exit", "raise", "signal", "killed")  # how the rank that went first ended


@st.composite
def launched(draw, world: int, culprit: int) -> dict:
    """How a torchrun job of `world` ranks ended once `culprit` went first: `how` (LAUNCH_ENDS: exit code 3, an
    exception of its own, SIGTERM from outside, SIGKILL), its neighbours that died of the closed connection
    (`echoes`: their tracebacks), the rest stopped by the launcher's SIGTERM (some exit 143 on their handler);
    `told`: the agent itself was told to stop first (a hang stopped from outside: every rank is stopped, none
    ended on its own); `cut`: the culprit's traceback is not in the log (a log cut at its start: exit code 1 and
    nothing else); `cut_echo`: an echo had exited before the launcher's signal, its traceback cut too (then two
    ranks went first of what the log does not show: nothing decides between them)."""
    how = draw(st.sampled_from(LAUNCH_ENDS))
    echoes = {r for r in (culprit - 1, culprit + 1) if 0 <= r < world and draw(st.booleans())}
    return {"how": how, "echoes": echoes, "told": draw(st.booleans()) and draw(st.booleans()),
            "cut": how == "raise" and draw(st.booleans()) and draw(st.booleans()),
            "cut_echo": min(echoes) if echoes and draw(st.booleans()) and draw(st.booleans()) else None,
            "handler": {r for r in range(world) if draw(st.booleans())}, "pid0": draw(st.integers(1000, 60000))}


def launcher_log(world: int, culprit: int, end: dict) -> str:
    """torchrun's console log of `launched`'s ending, as torch.distributed.elastic writes it."""
    return render_launch(launch_ends(world, culprit, end), end["pid0"], told=end["told"],
                         first=None if end["told"] else culprit)


def launch_ends(world: int, culprit: int, end: dict) -> dict[int, tuple]:
    """Each rank's end in `launched`'s ending, as render_launch takes them."""
    if end["told"]:
        return {r: (-15, "SIGTERM", None, True) for r in range(world)}
    own = {"exit": (3, None), "raise": (1, None), "signal": (-15, "SIGTERM"), "killed": (-9, "SIGKILL")}[end["how"]]
    shown = "ValueError: the batch holds no labels" if end["how"] == "raise" and not end["cut"] else None
    ends = {culprit: (*own, shown, False)}
    for r in sorted(end["echoes"]):
        ends[r] = (1, None, None, False) if r == end["cut_echo"] else (-15, "SIGTERM", PEER_CLOSED, True)
    for r in range(world):
        if r not in ends:
            ends[r] = (143, None, None, True) if r in end["handler"] else (-15, "SIGTERM", None, True)
    return ends


def render_launch(ends: dict[int, tuple], pid0: int, told: bool = False, first: int | None = None) -> str:
    """torchrun's console log of a job whose ranks ended so: rank -> (exit code, signal name or None, the
    exception its traceback shows or None, whether the launcher signalled it); `told`: the agent was signalled
    first; `first`: the failure the agent saw first (else the lowest rank it did not signal)."""
    pid = {r: pid0 + i for i, r in enumerate(sorted(ends))}  # (another host's agent may see the same pids)
    stamp = "W1128 10:26:38.207000 15823 site-packages/torch/distributed/elastic/multiprocessing/api.py"
    lines = [f"{stamp}:753] Received 15 death signal, shutting down workers"] if told else []
    for r, (_, _, exception, _) in sorted(ends.items()):
        if exception:
            lines += _traceback(r, exception, 77 if r == first else 63)
    lines += [f"{stamp}:1028] Sending process {pid[r]} closing signal SIGTERM" for r, e in sorted(ends.items()) if e[3]]
    if first is None or first not in ends:
        first = min((r for r, e in ends.items() if not e[3]), default=min(ends))
    lines.append(f"E1128 10:26:38.689000 15823 site-packages/torch/distributed/elastic/multiprocessing/api.py:1002] "
                 f"failed (exitcode: {ends[first][0]}) local_rank: {first} (pid: {pid[first]}) of binary: python")
    return _render(lines, {r: e[:2] for r, e in ends.items()}, pid, first)


def _traceback(rank: int, exception: str, line: int) -> list[str]:
    return [f"[rank{rank}]: {ln}" for ln in (
        "Traceback (most recent call last):", f'  File "/job/{USER}", line 90, in <module>', "    main()",
        f'  File "/job/{USER}", line {line}, in step', "    schedule.step(x)",
        '  File "/usr/lib/python3/site-packages/torch/distributed/pipelining/schedules.py", line 683, in _wait',
        "    w.wait()", exception)]


def _render(lines: list[str], failures: dict[int, tuple], pid: dict[int, int], first: int) -> str:
    def block(i: int, r: int) -> list[str]:
        code, sig = failures[r]
        told = f"Signal {-code} ({sig}) received by PID {pid[r]}" if sig else \
            "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"
        return [f"[{i}]:", "  time      : 2026-11-28_10:26:38", "  host      : node-a", f"  rank      : {r} (local_rank: {r})",
                f"  exitcode  : {code} (pid: {pid[r]}){f'  ({sig})' if sig else ' '}", "  error_file: <N/A>",
                f"  traceback : {told}"]
    out = lines + ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ", "=" * 60,
                   f"/job/{USER} FAILED", "-" * 60, "Failures:"]
    for i, r in enumerate(r for r in sorted(failures) if r != first):
        out += block(i + 1, r)
    out += ["-" * 60, "Root Cause (first observed failure):"] + block(0, first) + ["=" * 60]
    return "\n".join(out) + "\n"
