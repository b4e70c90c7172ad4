"""`sim from-trace --scale-pp`'s pipeline recognition on traces whose shape is known: the simulator's own
`--emit-trace` output of generated plans (fast; the real recorded runs are in test_sim_from_trace.py)."""

from __future__ import annotations

import pytest

from distdoctor.errors import InputError
from distdoctor.sim.emit import write_rank_traces
from distdoctor.sim.plans.from_trace import load_recorded, replay_program
from distdoctor.sim.plans.fsdp import FsdpConfig, build_fsdp
from distdoctor.sim.plans.pipeline import PipelineConfig, build_pipeline
from distdoctor.sim.plans.trace_pipeline import detect, rescale
from distdoctor.sim.result import simulate


def _emitted(program, path):
    write_rank_traces(simulate(program, detail=True), path)
    return replay_program(load_recorded([str(path)]))


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_generated_pipeline_is_recognised_with_its_schedule_and_replicas(tmp_path, schedule):
    cfg = PipelineConfig(stages=4, microbatches=8, dp=2, streams=1, schedule=schedule, steps=2)
    replay = _emitted(build_pipeline(cfg), tmp_path)
    shape = detect(replay)
    # Megatron order: rank = stage * D + replica, so the replicas are the even and the odd ranks
    assert shape.chains == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert (shape.microbatches, shape.steps, shape.schedule) == (8, 2, schedule)
    assert shape.act_bytes == cfg.act_bytes
    scaled = rescale(replay, 2, None)
    res = simulate(scaled.program)
    assert not res.deadlock and len(scaled.program.ranks) == 2 * 2
    assert scaled.info(res.state.makespan)["stage_compute_us"] == pytest.approx(shape.stage_compute_us * 2)


def test_a_run_without_p2p_is_not_a_pipeline(tmp_path):
    replay = _emitted(build_fsdp(FsdpConfig(ranks=4, shard_group=2, units=2)), tmp_path)
    assert detect(replay) == "it has no point-to-point traffic"
    with pytest.raises(InputError, match="--scale-pp: the recorded run is not a pipeline"):
        rescale(replay, 4, None)
