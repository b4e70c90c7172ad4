"""Fuzz the command line in-process (`distdoctor.cli.main([...])`): any argument list ends in a clean exit —
0/1, or 2 with one line on stderr that names what was wrong — never a traceback. Commands that would start
workers hand their parsed config to a stand-in launcher instead (what matters here is argument handling).
--master-addr is left out: resolving random names would send DNS queries off this machine."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from distdoctor import cli

from fuzz_inputs import FR_PICKLE, write


class _Launched(Exception):
    """The arguments were accepted and reached the launcher."""


SUBS = ["validate", "bench", "diagnose", "sim", "nosuch"]
FLAGS = ["--nproc", "--timeout", "--backend", "--master-port", "--iface", "--sizes", "--ops",
         "--dtypes", "--redops", "--seed", "--inject", "--format", "-b", "-e", "-f", "-n", "-w", "-c", "--op",
         "-d", "-o", "-r", "--min-busbw", "--world-size", "--out", "--chrome-trace", "run", "pipeline", "fsdp",
         "--stages", "--microbatches", "--schedule", "--help", "--version", "--no-subgroups"]
VALUES = ["0", "1", "-1", "2", "3", "1e400", "nan", "inf", "-0", "abc", "", " ", "4K", "1MiB", "1,2,3", "1,,2",
          "all_reduce", "nope", "float32", "bfloat16", "int8", "sum", "json", "text", "html", "gloo", "nccl",
          "127.0.0.1", "lo", "eth99", "crash:1", "corrupt:9", "delay:0:-1", "skip",
          "delay:x:y", "crash:-1", "\x00", "ä", "9" * 40, "../../etc/passwd", "--", "gpipe", "1f1b"]


@pytest.fixture(autouse=True, scope="module")
def sandbox_cwd(tmp_path_factory):
    """Commands may write where the fuzzed arguments point (--out, --chrome-trace, relative paths such as
    ../../etc/passwd): run them three levels deep inside a temporary directory, never in the checkout."""
    cwd = tmp_path_factory.mktemp("cli-fuzz") / "a" / "b" / "c"
    cwd.mkdir(parents=True)
    before = os.getcwd()
    os.chdir(cwd)
    yield cwd
    os.chdir(before)


@pytest.fixture(autouse=True)
def stand_in_launcher(monkeypatch):
    import distdoctor.bench.sweep as bench
    import distdoctor.validate.sweep as validate

    def launched(*a, **k):
        raise _Launched()

    monkeypatch.setattr(validate, "run_job", launched)
    monkeypatch.setattr(bench, "run_job", launched)


def _run(argv: list[str]) -> None:
    err, out = io.StringIO(), io.StringIO()
    code = None
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            cli.main(argv)
        except SystemExit as exc:
            code = exc.code
        except _Launched:
            return
    assert code in (0, 1, 2, 130), (argv, code, err.getvalue())
    text = err.getvalue()
    assert "Traceback" not in text, (argv, text)
    if code == 2:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        assert len(lines) == 1 and ": error: " in lines[0], (argv, text)


# No "/" or "~" in free text: `diagnose /` would (correctly) read every regular file on the machine.
tokens = st.one_of(st.sampled_from(FLAGS), st.sampled_from(VALUES),
                   st.text(alphabet=st.characters(blacklist_characters="/~\\"), max_size=8))


@given(st.sampled_from(SUBS), st.lists(tokens, max_size=8))
@example("diagnose", ["--out", "\x00"])  # a NUL byte in a path option: os.stat raised inside click
def test_random_arguments(sub, rest):
    _run([sub, *rest])


@given(st.sampled_from(["validate", "bench"]), st.lists(st.tuples(st.sampled_from(FLAGS), st.sampled_from(VALUES)),
                                                        max_size=5))
def test_flag_value_pairs(sub, pairs):
    _run([sub, *[x for pair in pairs for x in pair]])


@given(st.lists(st.sampled_from(["--format", "json", "text", "--world-size", "0", "4", "-1", "--out"]), max_size=4),
       st.booleans())
def test_diagnose_paths(extra, missing):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "missing") if missing else write(d, "dump_rank_0", FR_PICKLE)
        _run(["diagnose", path, *extra])
