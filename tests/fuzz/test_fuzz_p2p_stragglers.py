"""A pipeline stage slowed before each of its sends and receives (`run --inject delay:R:0.5` on a real pipeline
read as nothing: the straggler rule judged collectives only). Over generated pipelines whose sends and receives
meet as a rendezvous, with jitter: a healthy one has no finding, and a slowed stage is named, alone, whatever
stage it is; the stages that wait for it are never named."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from distdoctor.diagnose.analyze import analyze
from distdoctor.trace.model import Entry, GroupInfo, RankTrace, TraceSet
from test_fuzz_invariant import CHECKS


def _program(world: int, rank: int, rounds: int) -> list[tuple[str, int]]:
    """Each round: forward (receive from the stage before, send to the one after), then backward."""
    calls = []
    for _ in range(rounds):
        if rank > 0:
            calls.append(("recv", rank - 1))
        if rank < world - 1:
            calls += [("send", rank + 1), ("recv", rank + 1)]
        if rank > 0:
            calls.append(("send", rank - 1))
    return calls


def timelines(world: int, rounds: int, slow: int | None, delay: float, work: list[float], jitter: list[float]):
    """Every rank's calls with their arrival times: a rank arrives at its next call after its own work (and the
    delay, where it is the slowed one); a send and its receive both leave when the later of the two arrives."""
    calls = {r: _program(world, r, rounds) for r in range(world)}
    head, free = dict.fromkeys(range(world), 0), dict.fromkeys(range(world), 1000.0)
    arrive: dict[tuple[int, int], float] = {}
    moved = True
    while moved:
        moved = False
        for r in range(world):
            i = head[r]
            if i >= len(calls[r]):
                continue
            op, peer = calls[r][i]
            j = head[peer]
            if j >= len(calls[peer]) or calls[peer][j] != ("recv" if op == "send" else "send", r):
                continue
            for q, k in ((r, i), (peer, j)):
                arrive[(q, k)] = free[q] + work[q] + jitter[q] * ((k * 7 + q) % 5) / 4 + (delay if q == slow else 0)
            leave = max(arrive[(r, i)], arrive[(peer, j)])
            free[r] = free[peer] = leave
            head[r], head[peer], moved = i + 1, j + 1, True
    ts = TraceSet(world_size=world)
    for r in range(world):
        n: dict[tuple, int] = {}
        entries = []
        for k, (op, peer) in enumerate(calls[r]):
            n[(op, peer)] = n.get((op, peer), 0) + 1
            entries.append(Entry(index=k, group="0", op=op, seq=None, p2p_seq=n[(op, peer)], peer=peer,
                                 in_sizes=[[8]] if op == "send" else [], out_sizes=[[8]] if op == "recv" else [],
                                 in_dtypes=["float32"], out_dtypes=["float32"], state="completed",
                                 t_created=arrive[(r, k)]))
        ts.ranks[r] = RankTrace(rank=r, source="native", world_size=world,
                                groups={"0": GroupInfo("0", list(range(world)))}, entries=entries)
    return ts


@st.composite
def pipelines(draw):
    world = draw(st.integers(2, 6))
    return (world, draw(st.integers(6, 10)), draw(st.one_of(st.none(), st.integers(0, world - 1))),
            draw(st.sampled_from([0.05, 0.2, 0.5])),
            draw(st.lists(st.floats(0.001, 0.004), min_size=world, max_size=world)),
            draw(st.lists(st.floats(0.0, 0.003), min_size=world, max_size=world)))


@CHECKS
@given(pipelines())
def test_the_slowed_stage_alone_is_the_straggler(case):
    world, rounds, slow, delay, work, jitter = case
    found = [(f.kind, f.ranks) for f in analyze(timelines(*case)).findings]
    assert found == ([] if slow is None else [("straggler", [slow])]), found
