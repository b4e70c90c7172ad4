"""What srun's tasks print: 4 tasks on one node, as srun starts them (the variables of test_launchers.srun_env).
Only global rank 0 prints the validate report, in text as in JSON; the JSON document comes out whole (it is
written and flushed at once, so a rank stopped by the launcher the moment another ends cannot cut it)."""

from __future__ import annotations

import json
import os

from test_launchers import launch_tasks, srun_env

ARGS = ["validate", "--ops", "all_reduce", "--dtypes", "float32,float64", "--sizes", "1,1K,64K", "--timeout", "30"]


def _tasks(fmt: str):
    job = str(os.getpid())
    envs = [srun_env(r, ntasks=4, nodes="localhost", per_node="4", job=job) for r in range(4)]
    codes, outs = launch_tasks(envs, [*ARGS, "--format", fmt], timeout=240)
    assert codes == [0, 0, 0, 0], [o[1][-1500:] for o in outs]
    return [o[0] for o in outs]


def test_only_global_rank_0_prints_the_text_report_under_srun():
    outs = _tasks("text")
    assert "PASS:" in outs[0] and "on 4 ranks" in outs[0], outs[0]
    assert outs[1:] == ["", "", ""], outs[1:]


def test_the_json_report_under_srun_is_one_whole_document():
    outs = _tasks("json")
    assert outs[1:] == ["", "", ""], outs[1:]
    doc = json.loads(outs[0])  # one document, whole: json.loads fails on a cut one
    assert doc["passed"] and doc["world_size"] == 4 and len(outs[0]) > 2 * 8192  # past two stdio buffers
