"""`sim from-trace` of the healthy real-library jobs (DDP, FSDP2, HSDP, pipelining) the suite already recorded:
the replay finishes under every what-if (a healthy job carries no latent hang) and is set against the recorded
run (how close it comes is a wall-clock figure: benchmarks/from_trace_fidelity.py); the pipelining job is
recognised as a pipeline and re-derived at other degrees."""

from __future__ import annotations

import pytest

from distdoctor.errors import InputError
from distdoctor.sim.plans.from_trace import load_recorded, replay_program
from distdoctor.sim.plans.trace_pipeline import detect, rescale
from distdoctor.sim.result import simulate

pytestmark = pytest.mark.slow  # real multi-process jobs
HEALTHY = ("ddp_ok", "fsdp_ok", "hsdp_ok", "pp_ok")
WHAT_IFS = ({}, {"streams": "shared"}, {"eager_bytes": 0}, {"streams": "shared", "eager_bytes": 0})


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_job_replays_without_deadlock_beside_its_recorded_makespan(real_jobs, name):
    traces = load_recorded([real_jobs[name]["modes"]["recorder"]])
    for what_if in WHAT_IFS:
        replay = replay_program(traces, **what_if)
        res = simulate(replay.program, trials=4, jitter=0.3, jitter_comm=True)
        assert not res.deadlock and not res.timing.deadlocked, (what_if, res.to_text())
        assert replay.calls > 20 and not replay.skipped
        if not what_if:
            # the replay is set against the recorded run; how close it comes (the ratio) is a wall-clock figure
            # that moves with the machine's load: benchmarks/from_trace_fidelity.py measures it
            info = replay.info(res.state.makespan)
            assert info["recorded_makespan_us"] > 0 and info["simulated_makespan_us"] > 0, (name, info)
    # per rank one of the recorder's dump or the job's own Flight Recorder pickle or JSON (suite.py's mixed mode):
    # Gloo's Flight Recorder records no p2p, so sends to such a rank are left out rather than replayed unmatched
    replay = replay_program(load_recorded([real_jobs[name]["modes"]["mixed"]]))
    res = simulate(replay.program)
    assert not res.deadlock, res.to_text()
    assert set(replay.skipped) <= {"send/recv with a rank whose Flight Recorder dump records no p2p"}


def test_pipelining_job_is_a_pipeline_and_rescales(real_jobs):
    replay = replay_program(load_recorded([real_jobs["pp_ok"]["modes"]["recorder"]]))
    shape = detect(replay)
    # two GPipe pipelines of two stages over the mesh [[0, 1], [2, 3]]; 4 micro-batches, 2 steps (the set-up
    # shape exchange is not a micro-batch)
    assert shape.chains == [[0, 1], [2, 3]] and shape.schedule == "gpipe"
    assert (shape.microbatches, shape.steps) == (4, 2)
    spans = {}
    for k in (2, 4, 8):
        scaled = rescale(replay, k, None)
        res = simulate(scaled.program)
        assert not res.deadlock and len(scaled.program.ranks) == 2 * k
        spans[k] = res.state.makespan
    assert spans[2] > spans[4] > spans[8]  # the same work cut finer, as GPipe's bubble allows
    with pytest.raises(InputError, match="not a pipeline: it has no point-to-point traffic"):
        rescale(replay_program(load_recorded([real_jobs["ddp_ok"]["modes"]["recorder"]])), 4, None)


def test_a_recorded_hang_replays_as_the_deadlock_it_was_and_says_so(real_jobs):
    # FSDP2: rank 1's data loader never returns; the others wait in the next all_gather
    replay = replay_program(load_recorded([real_jobs["fsdp_loader_hang"]["modes"]["recorder"]]))
    res = simulate(replay.program)
    assert res.deadlock and replay.unfinished == {r: "hang" for r in range(4)}
    assert "did not finish (hang on rank(s) 0, 1, 2, 3)" in replay.warning()
    assert any("rank 1 never issues collective" in line and "all_gather" in line for line in res.explanation())
    ok = replay_program(load_recorded([real_jobs["ddp_ok"]["modes"]["recorder"]]))
    assert ok.unfinished == {} and ok.warning() == ""
