"""Reports as indented JSON: the fast path writes exactly what json.dumps(indent=2) writes, and NaN or infinity
(which it cannot take) still come out as the standard library writes them."""

from __future__ import annotations

import json

import pytest

from distdoctor.report.json_text import indented_json

SAMPLES = [
    {"findings": [{"kind": "stuck_collective", "ranks": [0, 1, 2], "seq": 1400, "op": "all_reduce", "why": "µ → ok"}],
     "empty": [], "none": {}, "nested": [[], [{}], {"a": [1, 2]}], "floats": [1.5e-7, 1e20, 0.1, -0.0, 2.0, 1 / 3],
     "text": 'quote " backslash \\ newline \n tab \t control \x01 line sep \u2028', "flags": [True, False, None],
     7: "an integer key", "big": 2 ** 70},
    [], {}, "text", 1.0, None,
    {"nan": float("nan"), "inf": [float("inf"), -float("inf")]},
]


@pytest.mark.parametrize("obj", SAMPLES, ids=range(len(SAMPLES)))
def test_the_same_bytes_as_the_standard_library(obj):
    assert indented_json(obj) == json.dumps(obj, indent=2)


def test_a_real_diagnose_report_reads_back(tmp_path):
    """A whole report through the CLI: one JSON document, indented as before."""
    from distdoctor.cli import main

    for r in range(2):
        (tmp_path / f"rank_{r}.json").write_text(json.dumps({
            "version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "entries": [{"record_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 1,
                         "profiling_name": "nccl:all_reduce", "state": "completed" if r else "started",
                         "input_sizes": [[4]], "output_sizes": [[4]], "input_dtypes": ["Float"],
                         "output_dtypes": ["Float"], "time_created_ns": 1}]}))
    out = tmp_path / "out"
    with pytest.raises(SystemExit):
        main(["diagnose", str(tmp_path), "--out", str(out)])
    text = (out / "diagnose.json").read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n"
