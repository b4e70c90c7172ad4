"""Every collective kind and p2p call is recorded with the right group, seq, root/peer, sizes and state, on 4 real
gloo ranks, and our group naming matches Flight Recorder's in the same run."""

from __future__ import annotations

import json

import pytest

from distdoctor.trace.model import loads

from recorder_helpers import WORKERS

pytestmark = pytest.mark.slow

WORLD = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base",
         "all_gather_coalesced", "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
         "gather", "scatter", "barrier", "monitored_barrier"]
OP_OF = {"all_gather_into_tensor": "all_gather", "_all_gather_base": "all_gather",
         "all_gather_coalesced": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
         "all_to_all_single": "all_to_all", "monitored_barrier": "barrier"}
ROOT = {"broadcast": 2, "reduce": 1, "gather": 3, "scatter": 0}


def expected_entries(rank: int) -> list[tuple]:
    """(raw_op, op, group, seq, p2p_seq, root, peer, async_op) in issue order."""
    mine = "1" if rank < 2 else "2"
    right, left, partner = (rank + 1) % 4, (rank - 1) % 4, rank ^ 1
    rows = [(raw, OP_OF.get(raw, raw), "0", i, None, ROOT.get(raw), None, False) for i, raw in enumerate(WORLD, 1)]
    rows += [("all_reduce", "all_reduce", mine, 1, None, None, None, False),
             ("broadcast", "broadcast", mine, 2, None, 1 if rank < 2 else 3, None, False),
             ("all_reduce", "all_reduce", "0", 16, None, None, None, True)]
    ring = [("send", "send", "0", None, 1, None, right, False), ("recv", "recv", "0", None, 1, None, left, False)]
    rows += ring if rank % 2 == 0 else ring[::-1]
    rows += [("isend", "send", "0", None, 2, None, partner, True) if rank % 2 == 0 else
             ("irecv", "recv", "0", None, 2, None, partner, True)]
    rows += [("batch_isend_irecv:isend", "send", "0", None, 3 if rank % 2 == 0 else 2, None, right, True),
             ("batch_isend_irecv:irecv", "recv", "0", None, 2 if rank % 2 == 0 else 3, None, left, True)]
    if rank == 0:
        rows.append(("send", "send", "0", None, 4, None, 1, False))
    if rank == 1:  # recv() with no src: the peer and its p2p_seq come from what torch returned
        rows.append(("recv", "recv", "0", None, 4, None, 0, False))
    rows.append(("barrier", "barrier", mine, 3, None, None, None, False))
    if rank == 0:
        rows += [("irecv", "recv", "0", None, 1, None, 1, True),
                 ("barrier", "barrier", "1", 4, None, None, None, False)]
    if rank == 1:
        rows += [("barrier", "barrier", "1", 4, None, None, None, False),
                 ("send", "send", "0", None, 1, None, 0, False)]
    return rows


def test_every_collective_and_p2p_is_recorded(ranks_factory, tmp_path):
    job = ranks_factory("all_ops.py", 4)
    codes = job.wait(timeout=180)
    assert codes == [0, 0, 0, 0], [job.output(r)[-2000:] for r in range(4)]

    for rank in range(4):
        result = json.loads((tmp_path / f"result_{rank}.json").read_text())
        trace = loads((tmp_path / "dumps" / f"rank_{rank}.jsonl").read_text())
        assert trace.rank == rank and trace.world_size == 4 and trace.source == "native"
        assert trace.dump_reason == "manual: all ops done" and trace.pid and trace.host
        mine = "1" if rank < 2 else "2"
        assert {n: g.ranks for n, g in trace.groups.items()} == {"0": [0, 1, 2, 3],
                                                                 mine: [0, 1] if rank < 2 else [2, 3]}
        got = [(e.raw_op, e.op, e.group, e.seq, e.p2p_seq, e.root, e.peer, e.async_op) for e in trace.entries]
        assert got == expected_entries(rank)
        assert [e.index for e in trace.entries] == list(range(len(trace.entries)))

        by_raw = {}
        for e in trace.entries:
            if e.group == "0":
                by_raw.setdefault(e.raw_op, e)
        for raw in WORLD:
            e = by_raw[raw]
            if raw in result["refused"]:
                assert e.error and e.state != "completed", raw
            else:
                assert e.error is None and e.state == "completed", (raw, e.error)
        for e in trace.entries:
            assert e.t_created <= e.t_started <= e.t_completed
            assert e.stream == "MainThread"
            assert e.frames and e.frames[-1].filename.endswith("all_ops.py"), e.frames
        ar = by_raw["all_reduce"]
        source = (WORKERS / "all_ops.py").read_text().splitlines()
        assert source[ar.frames[-1].line - 1] == "dist.all_reduce(t)" and ar.frames[-1].name == "<module>"
        assert (ar.in_sizes, ar.out_sizes, ar.in_dtypes, ar.reduce_op) == ([[5]], [[5]], ["float32"], "sum")
        assert by_raw["reduce"].reduce_op == "max"
        assert (by_raw["all_gather"].in_sizes, by_raw["all_gather"].out_sizes) == ([[5]], [[5]] * 4)
        assert by_raw["all_gather_into_tensor"].out_sizes == [[20]]
        assert (by_raw["reduce_scatter_tensor"].in_sizes, by_raw["reduce_scatter_tensor"].out_sizes) == ([[12]], [[3]])
        assert by_raw["all_to_all_single"].in_dtypes == ["float64"]
        assert by_raw["gather"].out_sizes == ([[5]] * 4 if rank == 3 else [])
        assert by_raw["scatter"].in_sizes == ([[5]] * 4 if rank == 0 else [])
        if rank == 0:  # issued -> started when torch handed back the Work -> completed by wait()
            assert result["async_states"] == ["started", "completed"]
        async_ar = [e for e in trace.entries if e.async_op and e.op == "all_reduce"][0]
        assert async_ar.in_dtypes == ["int64"] and async_ar.state == "completed"

        # Flight Recorder, on in the same run, names groups as we do and numbers the plain calls the same way.
        fr = result["fr_entries"]
        assert fr, "Flight Recorder recorded nothing: enable() did not switch it on"
        fr_groups = {e["process_group"][0] for e in fr}
        assert fr_groups == {"0", mine}
        fr_seq = {(e["process_group"][0], e["collective_seq_id"]): e["profiling_name"] for e in fr}
        for e in trace.entries[:6] + [x for x in trace.entries if x.group == mine]:
            assert fr_seq[(e.group, e.seq)] == f"gloo:{e.op}", (e.group, e.seq, e.raw_op)
        assert (tmp_path / "dumps" / f"rank_{rank}.fr.pkl").stat().st_size > 0
