"""One vocabulary for every loader: dtypes and op names read alike whatever wrote the trace, and a Flight Recorder
JSON dump of a rank that recorded nothing is that rank's (empty) trace."""

import json
import pickle

from distdoctor.collectives import canonical_dtype, canonical_op, same_collective
from distdoctor.diagnose import analyze
from distdoctor.trace.loaders import load_file, load_traces
from distdoctor.trace.model import Entry, GroupInfo, RankTrace, dumps

# What torch 2.13's _dump_fr_trace_json returns on a Gloo rank that recorded nothing: no `entries` key at all.
EMPTY_FR_JSON = (b'{"comm_lib_version":"","nccl_comm_state":{},"pg_config":{"":{"desc":"","name":"",'
                 b'"ranks":"[0, 1]"}},"pg_status":{},"version":"2.10"}')


def fr_entry(i, seq, dtype="Float", name="gloo:all_reduce", retired=True):
    return {"record_id": i, "process_group": ["0", "default_pg"], "collective_seq_id": seq, "p2p_seq_id": 0,
            "profiling_name": name, "time_created_ns": 10**18 + i, "input_sizes": [[8]], "output_sizes": [[8]],
            "input_dtypes": [dtype], "output_dtypes": [dtype], "state": "scheduled", "retired": retired,
            "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0, "is_p2p": False,
            "thread_name": "pt_main_thread"}


def native(rank, entries, world=2):
    return RankTrace(rank=rank, source="native", world_size=world, entries=entries,
                     groups={"0": GroupInfo("0", list(range(world)))}, dump_reason="hang")


def test_names_and_dtypes_have_one_spelling():
    assert [canonical_dtype(d) for d in ("Float", "float32", "torch.float32", "float")] == ["float32"] * 4
    assert [canonical_dtype(d) for d in ("BFloat16", "Long", "Byte", "Half", "Int")] == \
        ["bfloat16", "int64", "uint8", "float16", "int32"]
    assert canonical_op("nccl:coalesced") == "coalesced"
    assert canonical_op("gloo:_allgather_base") == canonical_op("all_gather_into_tensor") == "all_gather"
    assert canonical_op("nccl:reduce_scatter_tensor_coalesced") == "reduce_scatter"
    assert canonical_op("_all_gather_base") == "all_gather" and canonical_op("monitored_barrier") == "barrier"
    # Gloo's Flight Recorder records a reduce_scatter as all_reduce; NCCL's does not
    assert same_collective("all_reduce", "gloo:all_reduce", "reduce_scatter", "reduce_scatter_tensor")
    assert not same_collective("all_reduce", "nccl:all_reduce", "reduce_scatter", "reduce_scatter_tensor")


def test_a_rank_with_only_its_flight_recorder_dump_agrees_on_dtypes(tmp_path):
    """Rank 1 died before writing its recorder trace: its pickle says "Float" where rank 0's trace says
    "float32". That is one dtype, not a dtype_mismatch."""
    e = Entry(index=0, group="0", op="all_reduce", seq=1, in_sizes=[[8]], out_sizes=[[8]], in_dtypes=["float32"],
              out_dtypes=["float32"], state="completed")
    (tmp_path / "rank_0.jsonl").write_text(dumps(native(0, [e])))
    dump = {"version": "2.10", "pg_config": {}, "entries": [fr_entry(0, 1)]}
    (tmp_path / "rank_1.fr.pkl").write_bytes(pickle.dumps(dump))
    ts = load_traces([str(tmp_path)])
    assert ts.ranks[1].entries[0].in_dtypes == ["float32"]
    report = analyze(ts)
    assert report.verdict == "ok", [f.detail for f in report.findings]


def test_an_empty_flight_recorder_json_dump_is_a_trace(tmp_path):
    path = tmp_path / "fr_trace_rank_1.json"
    path.write_bytes(EMPTY_FR_JSON)
    trace = load_file(str(path))
    assert trace.rank == 1 and len(trace.entries) == 0 and trace.source == "flight_recorder-json"
    # a JSON object that is no dump at all is still refused
    (tmp_path / "other_rank_2.json").write_text(json.dumps({"version": "2.10"}))
    ts = load_traces([str(tmp_path)])
    assert sorted(ts.ranks) == [1] and "not a trace" in ts.errors[0].reason
