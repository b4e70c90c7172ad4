"""validate says how many checks it will run and, as it goes, how far it got and about how long the rest takes:
a rich bar on a terminal, lines on stderr otherwise (a log or CI shows the same). The count is the plan's."""

from __future__ import annotations

import json
import re

from world_helpers import distdoctor


def test_validate_counts_its_checks_on_stderr_without_a_terminal():
    out = distdoctor("validate", "--nproc", "2", "--ops", "all_reduce,broadcast", "--dtypes", "float32,int32",
                     "--sizes", "1,1K", "--format", "json", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    total = len(doc["results"])
    lines = out.stderr.splitlines()
    assert lines[0] == f"distdoctor validate: {total} checks …", out.stderr
    steps = [re.fullmatch(r"distdoctor validate: (\d+)/(\d+) checks, about (\d+) s left", ln) for ln in lines[1:]]
    assert steps and all(steps), out.stderr
    done = [int(m.group(1)) for m in steps]
    assert done == sorted(done) and all(0 < d < total and int(m.group(2)) == total for d, m in zip(done, steps))
    assert len(lines) <= 5  # the start and at most one line a quarter, whatever the length of the sweep
