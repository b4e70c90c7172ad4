"""The round trip: `diagnose` of the traces `sim --emit-trace` writes tells the simulator's story — the same first
finding (kind, ranks) and the same cycle sentence — for every shipped example and every generator deadlock of
these tests (one wait-for graph over (rank, stream), one findings language)."""

import inspect
import json
import subprocess
import sys
import textwrap

import pytest

from distdoctor.diagnose import analyze
from distdoctor.sim.command import examples_dir
from distdoctor.sim.emit import write_rank_traces
from distdoctor.sim.ir import load_program, parse_text
from distdoctor.sim.plans.p2p_calls import CallsConfig, build_calls
from distdoctor.sim.plans.pipeline import PipelineConfig, build_pipeline
from distdoctor.sim.result import simulate
from distdoctor.trace.loaders import load_traces

EXAMPLES = sorted(p.stem for p in examples_dir().glob("*.yaml"))


def _calls(P, order, schedule="interleaved", init=None, eager=64 << 10, **kw):
    cfg = PipelineConfig(stages=P, microbatches=2 * P, schedule=schedule,
                         chunks=2 if schedule == "interleaved" else 1, **{"act_bytes": 24, **kw})
    return build_calls(cfg, CallsConfig(order, init, eager))


def _yaml(text):
    return lambda: parse_text(textwrap.dedent(text), "plan.yaml")


def _torch_deferred():
    from distdoctor.sim.plans.schedule_program import ScheduleTiming
    from distdoctor.sim.plans.torch_schedule import schedule_classes
    from distdoctor.sim.schedule_report import load_schedule

    if "defer_pp_recv" not in inspect.signature(schedule_classes()["Interleaved1F1B"].__init__).parameters:
        pytest.skip("this torch has no defer_pp_recv")
    return load_schedule("Interleaved1F1B", None, 4, 8, 2, ScheduleTiming(p2p_bytes=8 << 20), defer_recv=True).program


# Every generator deadlock of tests/sim (megatron incidents, analytic, torch schedules), and one program per way a
# stream can be stuck (event and buffer cycles, a dropped release, a rank that never issues, a timing race).
GENERATED = {
    **{f"megatron-send-first-pp{P}": (lambda P=P: _calls(P, "send-first")) for P in (2, 3, 4, 8)},
    "megatron-send-first-1f1b-rendezvous": lambda: _calls(4, "send-first", schedule="1f1b", eager=0),
    "megatron-comm-init-neighbors-pp8": lambda: _calls(8, "parity", init="neighbors"),
    "interleaved-blocking-sends-on-compute-streams": lambda: build_pipeline(PipelineConfig(
        stages=4, microbatches=4, schedule="interleaved", chunks=2, streams=2)),
    "pipeline-grad-recv-on-fwd-stream-2x2": lambda: build_pipeline(PipelineConfig(
        stages=2, microbatches=4, dp=2, tp=2, grad_recv_stream="fwd")),
    "torch-interleaved1f1b-deferred-recv": _torch_deferred,
    "event-cycle": _yaml("""
        ranks:
          0:
            streams:
              s1: [{op: wait, event: e2}, {op: record, event: e1}]
              s2: [{op: wait, event: e1}, {op: record, event: e2}]
    """),
    "dropped-release": _yaml("""
        ranks:
          0:
            buffers: {slot: 1}
            streams:
              s: [{op: acquire, buffer: slot}, {op: compute, us: 5, name: f}, {op: acquire, buffer: slot}]
    """),
    "rank-never-issues": _yaml("""
        groups: {g: [0, 1, 2]}
        ranks:
          0: {streams: {s: [{op: collective, kind: all_reduce, bytes: 1024, group: g}]}}
          1: {streams: {s: [{op: collective, kind: all_reduce, bytes: 1024, group: g}]}}
          2: {streams: {s: [{op: compute, us: 3}]}}
    """),
}


def _both(prog, tmp_path, **kw):
    res = simulate(prog, detail=True, **kw)
    write_rank_traces(res, tmp_path)
    return res, analyze(load_traces([str(tmp_path)]))


def _same_story(res, report):
    sim, doc = res.findings(), report.findings
    if not sim:
        assert not res.deadlock and report.verdict == "ok", [f.detail for f in doc]
        return
    assert (doc[0].kind, doc[0].ranks) == (sim[0].kind, sim[0].ranks), (doc[0].detail, sim[0].detail)
    assert doc[0].detail.startswith(sim[0].detail)  # diagnose may add the call sites after it
    assert [(f.kind, f.ranks) for f in doc[:len(sim)]] == [(f.kind, f.ranks) for f in sim]


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_shipped_example_reads_alike_in_sim_and_diagnose(name, tmp_path):
    _same_story(*_both(load_program(examples_dir() / f"{name}.yaml"), tmp_path))


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_every_generator_deadlock_reads_alike_in_sim_and_diagnose(name, tmp_path):
    res, report = _both(GENERATED[name](), tmp_path)
    assert res.deadlock
    _same_story(res, report)


def test_a_deadlock_only_a_jittered_timing_shows_reads_alike(tmp_path):
    race = _yaml("""
        ranks:
          0:
            buffers: {b: 1}
            streams:
              s1: [{op: compute, us: 12}, {op: acquire, buffer: b}, {op: wait, event: e2}, {op: release, buffer: b}]
              s2: [{op: compute, us: 10}, {op: acquire, buffer: b}, {op: release, buffer: b}, {op: record, event: e2}]
    """)
    res, report = _both(race(), tmp_path, trials=40, jitter=0.3, seed=0)
    assert res.deadlock and report.findings[0].kind == "stream_deadlock"
    _same_story(res, report)


def test_the_grad_buffer_hang_through_the_cli_is_a_stream_cycle_not_missing_ranks(sim_cli, tmp_path):
    """`sim ... --emit-trace D && diagnose D`: the cycle through the fwd stream, a buffer slot, the bwd stream and
    an event, as `sim run` tells it (it used to read `missing_ranks [0-3] at send #1`); both exit 1."""
    sim = sim_cli("run", "a-pipeline-grad-buffer-on-fwd-stream", "--format", "json", "--emit-trace", tmp_path)
    assert sim.returncode == 1, sim.stderr
    out = json.loads(sim.stdout)
    doc = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", str(tmp_path), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert doc.returncode == 1, doc.stderr
    report = json.loads(doc.stdout)
    first, sim_first = report["findings"][0], out["findings"][0]
    assert set(sim_first) >= {"kind", "ranks", "group", "groups", "seq", "op", "detail", "evidence"}
    assert set(sim_first) == set(first)  # exactly diagnose's schema
    assert (first["kind"], first["ranks"]) == (sim_first["kind"], sim_first["ranks"]) == ("stream_deadlock", [0])
    assert first["detail"].startswith(sim_first["detail"]) and sim_first["detail"] == out["explanation"][0]
    assert "`act` slot" in first["detail"] and "event `grad_in0`" in first["detail"]
    assert [f["kind"] for f in report["findings"]] == ["stream_deadlock"] * 4  # each stage-0 rank, as in sim
    assert not any(f["kind"] == "missing_ranks" for f in report["findings"])


def test_a_desync_exits_1_in_sim_as_in_diagnose(sim_cli, tmp_path):
    plan = tmp_path / "desync.yaml"
    plan.write_text(textwrap.dedent("""
        groups: {g: [0, 1]}
        ranks:
          0: {streams: {s: [{op: collective, kind: all_reduce, bytes: 1024, group: g}]}}
          1: {streams: {s: [{op: collective, kind: all_gather, bytes: 1024, group: g}]}}
    """))
    out = sim_cli("run", plan, "--format", "json")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["deadlock"] is False and doc["mismatches"]
    assert [(f["kind"], f["ranks"], f["group"], f["seq"]) for f in doc["findings"]] == [("type_mismatch", [1], "g", 1)]
