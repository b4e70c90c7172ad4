"""Bad input through the real CLI: one line naming the position (rank, stream, op index) and the reason."""

import pytest

from distdoctor.errors import InputError
from distdoctor.sim.ir import parse_text

HEADER = "groups: {tp: [0, 1]}\nranks:\n"

CASES = {
    "unknown-op": (HEADER + "  0: {streams: {s: [{op: compute, us: 1}, {op: launch}]}}\n"
                            "  1: {streams: {s: []}}\n",
                   "plan.yaml: rank 0 stream s op 1: unknown op 'launch' (expected one of: compute, record"),
    "unknown-group": (HEADER + "  0: {streams: {s: [{op: collective, group: tp9, kind: all_reduce}]}}\n"
                               "  1: {streams: {s: []}}\n",
                      "plan.yaml: rank 0 stream s op 0: unknown group 'tp9' (groups: tp)"),
    "rank-not-in-group": (HEADER + "  0: {streams: {s: []}}\n  1: {streams: {s: []}}\n"
                                   "  2: {streams: {s: [{op: compute, us: 1},"
                                   " {op: collective, group: tp, kind: all_reduce}]}}\n",
                          "plan.yaml: rank 2 stream s op 1: rank 2 is not in group 'tp' [0, 1]"),
    "recv-no-sender": (HEADER + "  0: {streams: {s: [{op: send, peer: 1}]}}\n"
                                "  1: {streams: {s: [{op: recv, peer: 0}, {op: recv, peer: 0}]}}\n",
                       "plan.yaml: rank 1 stream s op 1: recv from 0 has no possible sender"),
    "negative-duration": (HEADER + "  0: {streams: {s: [{op: compute, us: -5}]}}\n  1: {streams: {s: []}}\n",
                          "plan.yaml: rank 0 stream s op 0: us: must not be negative (got -5)"),
    "cyclic-wait": (HEADER + "  0: {streams: {s: [{op: compute, us: 1}, {op: wait, event: e}, {op: record, event: e}]}}\n"
                             "  1: {streams: {s: []}}\n",
                    "plan.yaml: rank 0 stream s op 1: waits for event 'e', which only this stream records later"),
    "unknown-buffer": (HEADER + "  0: {streams: {s: [{op: acquire, buffer: act}]}}\n  1: {streams: {s: []}}\n",
                       "plan.yaml: rank 0 stream s op 0: unknown buffer 'act'"),
    "not-yaml": ("ranks: {0: [\n", "plan.yaml: not valid YAML/JSON at line"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_program_in_process(case):
    text, message = CASES[case]
    with pytest.raises(InputError) as err:
        parse_text(text, "plan.yaml")
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("case", ["unknown-op", "recv-no-sender", "negative-duration", "cyclic-wait", "not-yaml"])
def test_bad_program_through_the_cli_is_one_line(sim_cli, tmp_path, case):
    text, message = CASES[case]
    (tmp_path / "plan.yaml").write_text(text)
    out = sim_cli("run", "plan.yaml", "--format", "json", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"distdoctor sim: error: {message}")


def test_bad_generator_flags_and_missing_file(sim_cli, tmp_path):
    out = sim_cli("pipeline", "--stages", "4", "--microbatches", "6", "--schedule", "interleaved")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "--microbatches: the interleaved schedule takes micro-batches in groups of --stages" in out.stderr
    out = sim_cli("run", tmp_path / "nope.yaml")
    assert out.returncode == 2 and "nope.yaml: no such file" in out.stderr and out.stderr.count("\n") == 1


def test_sim_does_not_import_torch(sim_cli):
    import subprocess
    import sys

    code = ("import sys, distdoctor.sim.command, distdoctor.sim.emit, distdoctor.report.timeline_png; "
            "from distdoctor.sim.result import simulate; from distdoctor.sim.plans.pipeline import *; "
            "simulate(build_pipeline(PipelineConfig()), detail=True); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
