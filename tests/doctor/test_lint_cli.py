"""`distdoctor lint` without real jobs: bad input, the JSON contract on a simulated run that carries device
streams (false_wait from the shipped HSDP example, and its per-group-stream twin), and the recorder's
`group_creations` header staying backward compatible."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from distdoctor.cli import main
from distdoctor.trace.model import Entry, RankTrace, dumps, loads


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue(), err.getvalue()


def test_bad_input_is_one_line_naming_it(tmp_path):
    missing = str(tmp_path / "nope")
    code, out, err = run("lint", missing)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and missing in err and "no such file" in err
    (tmp_path / "junk.txt").write_text("hello\n")
    code, _, err = run("lint", str(tmp_path))
    assert code == 2 and err.count("\n") == 1 and str(tmp_path) in err


def _lint_sim(example: str, tmp_path) -> dict:
    d = tmp_path / example
    code, _, err = run("sim", "run", example, "--emit-trace", str(d))
    assert code == 0, err
    code, out, err = run("lint", str(d), "--format", "json")
    doc = json.loads(out)
    assert code == (1 if doc["hazards"] else 0), err
    return doc


def test_false_wait_on_a_shared_unshard_stream_and_not_with_one_per_group(tmp_path):
    shared = _lint_sim("b-hsdp-shared-unshard-stream", tmp_path)
    per_group = _lint_sim("b-hsdp-per-group-unshard-streams", tmp_path)
    assert set(shared) >= {"verdict", "hazards"} and shared["verdict"] == "hazards"
    on = {(h["evidence"]["stream"], tuple(h["ranks"]), tuple(h["groups"])) for h in shared["hazards"]
          if h["kind"] == "false_wait"}
    assert ("unshard", (0, 1, 2, 3), ("global", "shard0")) in on
    assert ("unshard", (4, 5, 6, 7), ("global", "shard1")) in on
    for h in shared["hazards"]:
        assert set(h) >= {"kind", "ranks", "groups", "sites", "detail"} and h["sites"]
    # One unshard stream per group: nothing queues there behind another group (both plans still share their
    # reduce-scatter stream, which lint names in both).
    assert not [h for h in per_group["hazards"] if h["evidence"].get("stream", "").startswith("unshard")]
    assert {h["kind"] for h in shared["hazards"]} == {"false_wait"}  # simulated frames are no call sites to compare


def test_group_creations_header_round_trips_and_old_dumps_load():
    t = RankTrace(rank=0, source="native", world_size=2,
                  entries=[Entry(index=0, group="0", op="all_reduce", seq=1, state="completed")],
                  group_creations=[{"api": "new_group", "ranks": [0, 1], "desc": "metrics", "index": 0,
                                    "frames": [{"name": "main", "filename": "/x/train.py", "line": 3}]}])
    text = dumps(t)
    assert loads(text).group_creations == t.group_creations
    header, *rest = text.splitlines()
    old = json.loads(header)
    del old["group_creations"]  # a dump written before the recorder recorded creations
    assert loads("\n".join([json.dumps(old), *rest])).group_creations is None


@pytest.mark.parametrize("bad", ([1, 2], "x", {"a": 1}))
def test_a_damaged_group_creations_header_is_ignored(bad):
    t = RankTrace(rank=0, source="native", world_size=1)
    header = json.loads(dumps(t))
    header["group_creations"] = bad
    assert loads(json.dumps(header)).group_creations is None
