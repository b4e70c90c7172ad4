"""Per-rank text logs as a trace source: the seed's before:/after: kernel logs of a stalled 8-rank pipeline, the pairing
rules, how stuck threads are told apart, custom markers, NCCL_DEBUG=INFO logs, and logs mixed with other traces."""

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scenarios.nccl_logs import write_nccl_logs
from scenarios.pipeline_logs import RECV_GRAD, SRC, stage_ops, write_pipeline_logs

from distdoctor.cli import main
from distdoctor.diagnose import analyze
from distdoctor.report.diagnose_text import render_text
from distdoctor.report.html import render_html
from distdoctor.trace.loaders import load_file, load_traces
from distdoctor.trace.loaders.logs import LogFormat, rank_of, using_format
from distdoctor.trace.model import RankLog

FIX = Path(__file__).parent / "fixtures"
ITERATIONS, MICRO = 6, 4


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    built = write_pipeline_logs(out, ranks=8, iterations=ITERATIONS, micro=MICRO)
    ts = load_traces([str(out)])
    return built, ts, analyze(ts)


def test_pipeline_logs_name_the_stuck_ranks_threads_and_ops(pipeline):
    built, ts, report = pipeline
    facts = built["facts"]
    # glog's oneflow.INFO link is read once; its WARNING files add nothing and are no error
    assert ts.errors == [] and sorted(ts.ranks) == list(range(8)) and ts.world_size == 8
    assert all(t.source == "log" and Path(t.path).parent.name == f"rank{r}" for r, t in ts.ranks.items())
    assert report.verdict == "problem"
    assert [(f.kind, f.ranks, f.op) for f in report.findings] == [("stuck_thread", [0, 1, 2, 3], RECV_GRAD)]
    f = report.findings[0]
    run = (ITERATIONS - 1) * MICRO + 1  # the first micro-batch of the last iteration
    assert f.evidence["why"] == "only_these_ranks" and f.evidence["run"] == run
    assert [(t["rank"], t["thread"], t["line"]) for t in f.evidence["threads"]] == [
        (r, facts[r]["threads"]["bwd"], f"{ts.ranks[r].path}:{facts[r]['stuck_line']}") for r in range(4)]
    assert "ranks 0-3 are inside System-Boxing-Recv-Grad-2108 (run 21)" in f.detail
    assert "(60.0 s before the log ends)" in f.detail

    first_grad = stage_ops(0, 6)[1][-1]
    for r in range(8):
        threads = report.ranks[str(r)]["threads"]
        tid = facts[r]["threads"]
        assert threads[tid["src"]]["open_op"] == SRC and threads[tid["src"]]["run"] == ITERATIONS + 1
        assert threads[tid["src"]]["line"] == f"{ts.ranks[r].path}:{facts[r]['src_line']}"
        assert threads[tid["fwd"]]["open_op"] is None and threads[tid["nccl"]]["open_op"] is None
        bwd = threads[tid["bwd"]]
        if r < 4:
            assert {k: bwd[k] for k in ("open_op", "last_done", "line")} == {
                "open_op": RECV_GRAD, "last_done": first_grad, "line": f"{ts.ranks[r].path}:{facts[r]['stuck_line']}"}
        else:
            assert bwd["open_op"] is None and bwd["last_done"] == "System-Boxing-Send-Grad-2107"
    # the faults real logs have, each handled and said
    log3 = report.ranks["3"]["log"]
    assert log3["skipped_lines"] == 2 == facts[3]["skipped"] and len(log3["skipped_at"]) == 2
    assert all(report.ranks[str(r)]["log"]["skipped_lines"] == 0 for r in range(8) if r != 3)
    assert report.ranks["3"]["threads"][facts[3]["threads"]["fwd"]]["unmatched_ends"] == 1  # its begin was unreadable
    assert report.ranks["5"]["threads"][facts[5]["threads"]["fwd"]]["unclosed"] == 1  # a begin logged twice
    assert report.ranks["6"]["threads"][facts[6]["threads"]["src"]]["unmatched_ends"] == 1  # the log starts with an end
    assert report.ranks["7"]["log"]["lines"] == facts[7]["lines"]  # the cut-off last line is counted, not read
    assert all(report.ranks[str(r)]["log"]["behind_peers"] == 0 for r in range(8))  # none of that is lagging

    text = render_text(report)
    assert f"rank 0 thread {facts[0]['threads']['bwd']}: inside {RECV_GRAD} (run 21) since " \
           f"{ts.ranks[0].path}:{facts[0]['stuck_line']}, 60.0 s before the log ends" in text
    assert f"log lines skipped as unreadable: rank 3: 2 (first at {log3['skipped_at'][0]}); none on the other 7 ranks" \
        in text
    lines = text.splitlines()
    first_thread = lines.index("where each thread is (per-rank logs; the stuck and the furthest behind first):") + 1
    assert all(RECV_GRAD in line for line in lines[first_thread:first_thread + 4])  # the stuck threads come first
    json.dumps(report.to_json())
    assert "<h2>Threads (per-rank logs)</h2>" in render_html(report)


def test_cli_reads_a_directory_of_rank_logs(tmp_path, run_cli):
    built = write_pipeline_logs(tmp_path / "logs", ranks=8, iterations=3, micro=2, blocks=3, layout="flat")
    got = run_cli("diagnose", str(tmp_path / "logs"), "--format", "json", "--out", str(tmp_path / "out"))
    assert got.returncode == 1, got.stderr
    doc = json.loads(got.stdout)
    assert [(f["kind"], f["ranks"], f["op"]) for f in doc["findings"]] == [("stuck_thread", [0, 1, 2, 3], RECV_GRAD)]
    bwd = built["facts"][2]["threads"]["bwd"]
    assert doc["ranks"]["2"]["threads"][bwd]["line"] == f"{built['paths'][2]}:{built['facts'][2]['stuck_line']}"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "diagnose.html", "diagnose.json", "diagnose.trace.json", "diagnose.txt"]


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _glog(tid: int, kind: str, op: str, sec: float = 0.0) -> str:
    return f"I20240501 10:00:{sec:09.6f} {tid} kernel.cpp:51] {kind}: {op}"


def _runs(tid: int, op: str, n: int) -> list[str]:
    return [_glog(tid, k, op) for _ in range(n) for k in ("before", "after")]


def test_a_thread_inside_an_op_its_peers_finished_comes_first(tmp_path):
    for r in range(3):
        lines = _runs(10, "X", 1) + _runs(10, "Y", 1) + [_glog(20, "before", "Src")]  # Src open everywhere
        lines += [_glog(10, "before", "X")] if r == 1 else _runs(10, "X", 1) + [_glog(10, "before", "Z")]
        _write(tmp_path / f"rank_{r}.log", lines)
    report = analyze(load_traces([str(tmp_path)]))
    assert [(f.kind, f.ranks, f.op, f.evidence["why"]) for f in report.findings] == [
        ("stuck_thread", [1], "X", "peers_finished"), ("stuck_thread", [0, 2], "Z", "only_these_ranks")]
    assert report.findings[0].evidence["finished_by"] == [0, 2] and report.findings[0].evidence["run"] == 2
    assert "rank 1 began X (run 2) and never finished it, while ranks 0, 2 finished that run" in \
        report.findings[0].detail
    assert report.ranks["1"]["log"]["behind_peers"] == 1 and report.ranks["0"]["log"]["behind_peers"] == 0


def test_ranks_that_never_began_the_op_their_peers_are_inside_are_named(tmp_path):
    for r in range(3):
        _write(tmp_path / f"rank_{r}.log", _runs(7, "Gather", 2) + (_runs(7, "Idle", 1) if r == 2 else
                                                                   [_glog(7, "before", "Gather")]))
    report = analyze(load_traces([str(tmp_path)]))
    [f] = report.findings
    assert (f.kind, f.ranks, f.op, f.evidence["why"], f.evidence["not_begun_by"]) == (
        "stuck_thread", [0, 1], "Gather", "peers_behind", [2])
    assert "rank 2 ran Gather before but never began run 3" in f.detail
    assert "rank 2 thread 7 idle after Idle" in f.detail


def test_an_op_every_rank_is_inside_is_a_finding_only_when_nothing_else_is(tmp_path):
    for r in range(2):
        _write(tmp_path / f"rank_{r}.log", _runs(3, "A", 2) + [_glog(3, "before", "AllReduce-grad")])
    [f] = analyze(load_traces([str(tmp_path)])).findings
    assert (f.kind, f.ranks, f.op, f.evidence["why"]) == ("stuck_thread", [0, 1], "AllReduce-grad", "every_rank")


def test_pairing_rules(tmp_path):
    cases = {  # markers of one thread -> (open_op, also_open, last_done, unclosed, unmatched_ends, run)
        "before X|after X|before X": ("X", [], "X", 0, 0, 2),  # the seed: the second run is open
        "before X|before X|after X": (None, [], "X", 1, 0, 0),  # a begin whose end never came, superseded
        "after X|before X": ("X", [], "X", 0, 1, 1),  # the log starts inside X: that run is not counted
        "before X|after X|after X|before X": ("X", [], "X", 0, 1, 3),  # a begin line lost: its run is counted
        "before A|before B|after B": ("A", [], "B", 0, 0, 1),  # B ran inside A
        "before A|before B": ("B", ["A"], None, 0, 0, 1),  # stuck in B, inside A
        "before A|before B|after A": ("B", [], "A", 0, 0, 1),  # an end closes only its own op
    }
    for i, (markers, want) in enumerate(cases.items()):
        path = tmp_path / f"rank_{i}.log"
        _write(path, [_glog(5, *m.split(" ", 1)) for m in markers.split("|")])
        st = load_file(str(path)).log.threads["5"]
        assert (st.open_op, [op for op, _ in st.also_open], st.last_done, st.unclosed, st.unmatched_ends,
                st.run) == want, markers


def test_custom_markers_thread_and_rank_from_the_path(tmp_path):
    lines = ["2024-05-01 10:00:00,001 INFO [worker-1] step 3 starting",
             "2024-05-01 10:00:00,002 INFO [worker-1] >> forward_step",
             "2024-05-01 10:00:00,003 INFO [worker-1] << forward_step",
             "2024-05-01 10:00:00,004 INFO [comm] >> all_reduce_grads"]
    _write(tmp_path / "node3-0.txt", lines)
    _write(tmp_path / "node3-1.txt", lines[:3] + ["2024-05-01 10:00:00,004 INFO [comm] >> all_reduce_grads",
                                                  "2024-05-01 10:00:00,005 INFO [comm] << all_reduce_grads"])
    fmt = LogFormat(begin=r"\[(?P<thread>[\w-]+)\] >> (?P<op>\S+)", end=r"\[(?P<thread>[\w-]+)\] << (?P<op>\S+)",
                    rank=r"node\d+-(?P<rank>\d+)\.txt$")
    with using_format(fmt):
        ts = load_traces([str(tmp_path)])
    assert ts.errors == [] and sorted(ts.ranks) == [0, 1]
    assert ts.ranks[0].log.threads["comm"].open_op == "all_reduce_grads"
    assert ts.ranks[0].log.threads["worker-1"].last_done == "forward_step"
    [f] = analyze(ts).findings
    assert (f.ranks, f.op, f.evidence["why"]) == ([0], "all_reduce_grads", "peers_finished")
    with using_format(LogFormat(begin=r">> (?P<op>\S+)", end=r"<< (?P<op>\S+)", rank=fmt.rank)):
        assert set(load_traces([str(tmp_path)]).ranks[0].log.threads) == {"main"}  # no thread group: one thread


@pytest.mark.parametrize("args, message", [
    (["--begin", "x(?P<op>.+)"], "--begin/--end: give both"),
    (["--begin", "(", "--end", "y(?P<op>.+)"], "--begin: not a regular expression"),
    (["--begin", "x(?P<op>.*)", "--end", "y(?P<name>.+)"], "--end: needs a named group (?P<op>...)"),
    (["--log-rank", "rank"], "--log-rank: needs a named group (?P<rank>...)"),
    (["--begin", "(?i)x(?P<op>.+)", "--end", "y(?P<op>.+)"], "--begin/--end: cannot be used together"),
])
def test_bad_log_flags_are_one_line_errors(tmp_path, capsys, args, message):
    _write(tmp_path / "rank_0.log", _runs(1, "A", 1))
    with pytest.raises(SystemExit) as exc:
        main(["diagnose", str(tmp_path), *args])  # the CLI's own entry point, in this process
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert err.startswith(f"distdoctor diagnose: error: {message}") and err.count("\n") == 1


@pytest.mark.parametrize("path, rank", [("/j/rank_3.log", 3), ("/j/logs/rank12/oneflow.INFO", 12),
                                        ("/j/run-rank-7.txt", 7), ("/j/RANK5/x.log", 5), ("/j/local_rank0/x.log", None),
                                        ("/j/ranking/x.log", None), ("/j/x.log", None)])
def test_rank_from_the_path(path, rank):
    assert rank_of(path, LogFormat()) == rank


def test_logs_that_say_nothing_or_no_rank(tmp_path):
    _write(tmp_path / "train.log", _runs(1, "A", 1))  # markers, but no rank in the name
    _write(tmp_path / "rank_1.log", ["I20240501 10:00:00.000001 5 main.cpp:1] hello"])  # a glog log without markers
    ts = load_traces([str(tmp_path)])
    reasons = {Path(e.path).name: e.reason for e in ts.errors}
    assert not ts.ranks and reasons["train.log"].startswith("cannot tell which rank wrote this log")
    assert reasons["rank_1.log"] == "a log, but with no before:/after: markers nor NCCL INFO collective lines"
    _write(tmp_path / "rank_2.log", ["node-0:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
                                     "node-0:1:9 [0] NCCL INFO ncclCommInitRank comm 0xa rank 2 nranks 4 cudaDev 0 "
                                     "nvmlDev 0 busId 1000 commId 0x99 - Init COMPLETE"])
    with pytest.raises(ValueError, match="no collective call among them: run with NCCL_DEBUG=INFO "
                                         "NCCL_DEBUG_SUBSYS=INIT,COLL"):
        load_file(str(tmp_path / "rank_2.log"))


@pytest.mark.parametrize("version", ["2.17", "2.18", "2.21", "ray"])
def test_nccl_logs_give_the_flight_recorder_finding(tmp_path, version):
    """Rank 3 stops before the last world all_reduce: missing_ranks [3], as Flight Recorder dumps of such a job say."""
    write_nccl_logs(tmp_path, steps=10, stop=3, version=version)
    ts = load_traces([str(tmp_path)])
    assert ts.errors == [] and ts.world_size == 4
    report = analyze(ts)
    world = "nranks=4#0" if version == "2.17" else "0x7a3b9f2c1e4d5a6b"
    assert [(f.kind, f.ranks, f.op, f.group, f.seq) for f in report.findings] == [
        ("missing_ranks", [3], "all_reduce", world, 10)]
    assert [(w.rank, w.waits_for) for w in report.waits] == [(0, [3]), (1, [3]), (2, [3])]
    pairs = {name: g.ranks for name, g in ts.ranks[0].groups.items()} | \
        {name: g.ranks for name, g in ts.ranks[3].groups.items()}
    assert sorted(pairs.values()) == [[0, 1], [0, 1, 2, 3], [2, 3]]
    e = ts.ranks[2].entries[0]  # the broadcast: root translated, sizes and dtype as Flight Recorder names them
    assert (e.op, e.root, e.in_sizes, e.in_dtypes) == ("broadcast", 0, [[4096]], ["Float"])
    assert report.ranks["3"]["log"]["nccl"][world] == {
        "call": "AllReduce", "opCount": "9", "line": f"{tmp_path}/rank_3.log:24", "comm_rank": 3, "nranks": 4,
        "named_by": "creation order" if version == "2.17" else "commId"}
    [line] = [x for x in render_text(report).splitlines() if x.startswith("  rank 3: '")]
    assert f"'{world}' AllReduce opCount 9 ({tmp_path}/rank_3.log:24)" in line

    fr = tmp_path / "fr"  # the same job's Flight Recorder dumps
    fr.mkdir()
    for rank in range(4):
        entries = [{"record_id": i, "process_group": ["0", "default_pg"], "collective_seq_id": i + 1, "p2p_seq_id": 0,
                    "profiling_name": "nccl:all_reduce", "time_created_ns": 10**18 + i, "input_sizes": [[1024]],
                    "output_sizes": [[1024]], "input_dtypes": ["Float"], "output_dtypes": ["Float"],
                    "state": "scheduled" if i == 10 else "completed", "retired": i < 10, "is_p2p": False,
                    "time_discovered_started_ns": 0, "time_discovered_completed_ns": 0, "thread_name": "main"}
                   for i in range(10 if rank == 3 else 11)]
        (fr / f"rank_{rank}.json").write_text(json.dumps({"version": "2.10", "entries": entries, "pg_config": {
            "0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}}))
    [f] = analyze(load_traces([str(fr)])).findings
    assert (f.kind, f.ranks, f.op) == ("missing_ranks", [3], "all_reduce")


def test_nccl_logs_of_a_job_whose_calls_all_match(tmp_path):
    write_nccl_logs(tmp_path, steps=4, stop=None)
    report = analyze(load_traces([str(tmp_path)]))
    assert report.verdict == "ok" and not report.waits
    assert all(e.state == "completed" for t in report.traces.ranks.values() for e in t.entries)


def test_nccl_lines_of_several_processes_in_one_file_are_refused(tmp_path):
    lines = [f"host-{r}:{100 + r}:{100 + r} [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x2 count 4 "
             f"datatype 7 op 0 root 0 comm 0x{r}0 [nranks=2] stream 0x9" for r in range(2)]
    _write(tmp_path / "rank_0.log", lines)
    with pytest.raises(ValueError, match="holds the NCCL lines of 2 processes"):
        load_file(str(tmp_path / "rank_0.log"))
    # a host name starting with "c", like a protocol-0 pickle's first byte, is still read as a log
    _write(tmp_path / "rank_1.log", lines[:1])
    assert load_file(str(tmp_path / "rank_1.log")).entries[0].op == "all_reduce"


def test_logs_join_the_flight_recorder_dumps_of_their_ranks(tmp_path):
    for r in range(4):
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes((FIX / "nccl_style" / f"nccl_trace_rank_{r}").read_bytes())
        _write(tmp_path / "logs" / f"rank_{r}.log",
               _runs(9, "fwd", 2) + ([_glog(9, "before", "fwd")] if r == 1 else []))
    dumps = [str(p) for p in tmp_path.glob("nccl_trace_rank_*")]
    alone = [(f.kind, f.ranks) for f in analyze(load_traces(dumps)).findings]
    ts = load_traces([str(tmp_path)])
    assert ts.errors == [] and all(t.source == "flight_recorder-pickle" for t in ts.ranks.values())
    assert all(isinstance(t.log, RankLog) for t in ts.ranks.values())
    report = analyze(ts)
    assert [(f.kind, f.ranks) for f in report.findings] == alone + [("stuck_thread", [1])]
    assert report.ranks["1"]["threads"]["9"]["open_op"] == "fwd" and report.ranks["1"]["completed"]


def test_many_logs_load_in_worker_processes_as_in_one(tmp_path):
    """64 files or more are read by the loader's worker processes: the same traces come back."""
    for r in range(64):
        lines = _runs(4, "step", 3) + [_glog(4, "before", "step")] if r != 17 else _runs(4, "step", 3)
        lines += [f"node-{r}:{500 + r}:{500 + r} [0] NCCL INFO AllReduce: opCount {k} sendbuff 0x1 recvbuff 0x2 "
                  f"count 8 datatype 7 op 0 root 0 comm 0x{r}f [nranks=64] stream 0x9"
                  for k in range(3 if r != 9 else 2)]
        _write(tmp_path / f"rank_{r}.log", lines)
    one, many = load_traces([str(tmp_path)], jobs=1), load_traces([str(tmp_path)], jobs=2)
    assert many.errors == one.errors == [] and sorted(many.ranks) == list(range(64))
    for r in (0, 9, 17):
        assert many.ranks[r].log == one.ranks[r].log and list(many.ranks[r].entries) == list(one.ranks[r].entries)
    a, b = analyze(one), analyze(many)
    assert [(f.kind, f.ranks, f.op) for f in b.findings] == [(f.kind, f.ranks, f.op) for f in a.findings] == [
        ("missing_ranks", [9], "all_reduce"), ("stuck_thread", [r for r in range(64) if r != 17], "step")]


_GOOD_LOG = ([_glog(11, k, op, 0.001 * i) for i, (op, k) in enumerate(
    [("Src", "before"), ("Src", "after"), ("A", "before"), ("A", "after"), ("B", "before"), ("Src", "before")])]
    + ["node-0:77:78 [0] NCCL INFO ncclCommInitRank comm 0xa1 rank {r} nranks 2 cudaDev 0 nvmlDev 0 busId 1000 "
       "commId 0x99 - Init COMPLETE"]
    + [f"node-0:77:77 [0] NCCL INFO AllReduce: opCount {k} sendbuff 0x1 recvbuff 0x2 count 8 datatype 7 op 0 root 0 "
       f"comm 0xa1 [nranks=2] stream 0x9" for k in range(3)])


@st.composite
def _damaged_log(draw):
    lines = [line.replace("{r}", "0") for line in _GOOD_LOG]
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["drop", "twice", "cut", "bytes", "garbage"]))
        if kind == "drop":
            del lines[i]
        elif kind == "twice":
            lines.insert(i, lines[i])
        elif kind == "cut":
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
        elif kind == "bytes":
            j = draw(st.integers(0, max(0, len(lines[i]) - 1)))
            lines[i] = lines[i][:j] + draw(st.binary(max_size=6)).decode("latin-1") + lines[i][j:]
        else:
            lines.insert(i, draw(st.binary(max_size=60)).decode("latin-1"))
        if not lines:
            break
    return "\n".join(lines).encode("latin-1")


@settings(max_examples=40, deadline=None)
@given(data=_damaged_log())
@example(data=b"I20240501 10:00:00.003000 11 \xc2\x80\x1ckernel.cpp:51] after: A\n"
              b"I20240501 10:00:00.004000 11 kernel.cpp:51] before: B\n").via(
    "a control byte (\\x1c) the bytes pattern read as part of a name, the text one as a space: a crash")
def test_damaged_logs_are_read_as_far_as_they_go(data):
    """Whatever a log's lines hold, loading and diagnosing never fail: bad lines are skipped, the other rank loads."""
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "rank_0.log").write_bytes(data)
        _write(Path(d) / "rank_1.log", [line.replace("{r}", "1") for line in _GOOD_LOG])
        ts = load_traces([d])
    assert 1 in ts.ranks and all(e.reason.isprintable() and e.path.endswith("rank_0.log") for e in ts.errors)
    report = analyze(ts)
    json.dumps(report.to_json())
    render_text(report), render_html(report)
    for p in report.ranks.values():
        assert p.get("log", {}).get("skipped_lines", 0) >= 0
        assert all(st["done"] >= 0 and st.get("unclosed", 0) >= 0 for st in p.get("threads", {}).values())


def test_nccl_call_lines_as_users_posted_them(tmp_path):
    """Lines from NCCL's issue tracker (NVIDIA/nccl#1193 behind Ray's prefix, #584 Send/Recv, #1238 with a trailing
    space; pytorch/torchtitan#1369): each is one call, read whatever precedes it."""
    lines = [
        "(RayTrainWorker pid=615, ip=10.72.7.6) r24-02-22-23-29-0066-raycluster-lv52c-worker-l4-8-fqztx:615:18953 [2] "
        "NCCL INFO AllReduce: opCount 139d sendbuff 0x78d056200000 recvbuff 0x78d056200000 count 7382228 datatype 7 "
        "op 0 root 0 comm 0x78cfda045840 [nranks=128] stream 0x78d07125e5e0",
        "r24-02-22-23-29-0066-raycluster-lv52c-worker-l4-8-fqztx:615:18953 [2] NCCL INFO Send: opCount 12 sendbuff "
        "0x7f505e93c000 recvbuff (nil) count 2420736 datatype 7 op 0 root 1 comm 0x7f5128002e10 [nranks=2] stream "
        "0x55f1de727ae0",
        "r24-02-22-23-29-0066-raycluster-lv52c-worker-l4-8-fqztx:615:18953 [2] NCCL INFO AllReduce: opCount 0 sendbuff "
        "0x7fc9c4000000 recvbuff 0x7fc9bc000000 count 33554432 datatype 7 op 0 root 0 comm 0x5631f0816b40 [nranks=1] "
        "stream 0x5631f0021140 ",
        "r24-02-22-23-29-0066-raycluster-lv52c-worker-l4-8-fqztx:615:18953 [2] NCCL INFO AllGather: opCount d sendbuff "
        "0x7fa921200000 recvbuff 0x7fa915800000 count 2097152 datatype 7 op 0 root 0 comm 0x55fca23fc0f0 [nranks=2] "
        "stream 0x55fca193e8e0",
    ]
    _write(tmp_path / "rank_2.log", lines)
    t = load_file(str(tmp_path / "rank_2.log"))
    host = "r24-02-22-23-29-0066-raycluster-lv52c-worker-l4-8-fqztx"
    assert (t.rank, t.host, t.pid, t.log.skipped) == (2, host, 615, 0)
    assert [(e.op, e.seq, e.p2p_seq, e.in_sizes, e.out_sizes, e.peer) for e in t.entries] == [
        ("all_reduce", 0x139d, None, [[7382228]], [[7382228]], None), ("send", None, 0x12, [[2420736]], [[2420736]], 1),
        ("all_reduce", 0, None, [[33554432]], [[33554432]], None),
        ("all_gather", 0xd, None, [[2097152]], [[2 * 2097152]], None)]


def test_a_thread_that_stopped_between_ops_behind_its_peers(tmp_path):
    for r in range(3):  # nothing open anywhere; rank 2's thread finished one step fewer and began nothing since
        _write(tmp_path / f"rank_{r}.log", _runs(6, "load", 3) + _runs(6, "step", 2 if r == 2 else 3))
    [f] = analyze(load_traces([str(tmp_path)])).findings
    assert (f.kind, f.ranks, f.op, f.evidence["why"], f.evidence["run"], f.evidence["finished_by"]) == (
        "stuck_thread", [2], "step", "idle_behind", 3, [0, 1])
    assert f.evidence["threads"][0]["line"] == f"{tmp_path}/rank_2.log:10"
    assert "rank 2 finished run 2 of step and began nothing since on that thread, while ranks 0, 1 finished run 3" \
        in f.detail
    for r in range(3):  # the same logs with every rank at the same point: nothing to report
        _write(tmp_path / f"rank_{r}.log", _runs(6, "load", 3) + _runs(6, "step", 3))
    assert analyze(load_traces([str(tmp_path)])).verdict == "ok"
