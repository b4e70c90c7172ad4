"""Hostile inputs a newcomer types, each run as the real command line (`python -m distdoctor ...`) in its own
process: every one ends in exit 2 with one line on stderr that names the input and the reason, no traceback,
within a bound of time (a hang or a read to the end of /dev/zero is killed there and fails) and of memory (the
child's peak resident memory, from wait4, below 500 MB; an address-space limit keeps a runaway from taking the
machine down first). Each class has several members: a number that is NaN, infinite, negative or past its cap,
for every kind of option; a path that is a device, a FIFO, a link loop, a dangling link, a sparse file; a trace
whose header or sequence numbers are impossible, in each trace format.

The second half walks every command's declared options: no option takes a bare float or an uncapped int, and
every number option refuses NaN and infinity in one line (so a new option cannot forget it)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import pickle
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from fuzz_inputs import FR_JSON_OBJ, FR_OBJ
from test_fuzz_native import SEED_TEXT

from distdoctor import cli
from distdoctor.options import ByteSize, Number

SRC = str(Path(__file__).resolve().parents[2] / "src")
BOUND_S = 60  # a hang, or a read that never ends, is killed here (the figure to meet is < 10 s)
MAX_RSS = 500 << 20
ADDRESS_SPACE = 6 << 30  # a runaway read fails its allocation here instead of reaching the OOM killer


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A directory of hostile files: a FIFO, a link to itself, a dangling link, a 2 GiB sparse file, a file of
    zeros, and traces whose numbers are impossible (native, Flight Recorder pickle and JSON)."""
    d = tmp_path_factory.mktemp("hostile")
    os.mkfifo(d / "fifo")
    os.symlink("loop", d / "loop")
    os.symlink("nowhere", d / "dangling")
    with open(d / "sparse", "wb") as f:
        f.truncate(2 << 30)
    (d / "zeros").write_bytes(bytes(1 << 20))
    (d / "mixed").mkdir()  # a real dump beside a 600 MB sparse file: the directory is refused naming the file
    (d / "mixed" / "fr_pickle_rank_0").write_bytes(pickle.dumps(FR_OBJ))
    with open(d / "mixed" / "core", "wb") as f:
        f.truncate(600 << 20)
    laughs = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']  # a YAML alias bomb: 9^9 leaves if expanded
    laughs += [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefg", "bcdefgh")]
    (d / "bomb.yaml").write_text("\n".join(laughs) + "\nranks: {0: {s: *h}}\n")
    (d / "ws_neg_rank_1.jsonl").write_text(SEED_TEXT.replace('"world_size": 4', '"world_size": -4', 1))
    (d / "seq_neg_rank_1.jsonl").write_text(SEED_TEXT.replace('"seq": 1,', '"seq": -5,', 1))
    (d / "rank_neg.jsonl").write_text(SEED_TEXT.replace('"rank": 1,', '"rank": -3,', 1))
    (d / "seq_huge_rank_1.jsonl").write_text(SEED_TEXT.replace('"seq": 1,', f'"seq": {"9" * 30},', 1))
    pkl = copy.deepcopy(FR_OBJ)
    pkl["entries"][0]["collective_seq_id"] = 10**30
    (d / "fr_huge_rank_0").write_bytes(pickle.dumps(pkl))
    for name, value in (("fr_neg_rank_0.json", -5), ("fr_huge_rank_0.json", 2**64)):
        obj = copy.deepcopy(FR_JSON_OBJ)
        obj["entries"][0]["collective_seq_id"] = value
        (d / name).write_text(json.dumps(obj))
    return d


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_bounded(argv: list[str], cwd: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in bytes) of `python -m distdoctor ARGV`, killed at BOUND_S."""
    env = dict(os.environ, PYTHONPATH=SRC)
    with open(cwd / "stderr", "w+b") as err:
        proc = subprocess.Popen([sys.executable, "-m", "distdoctor", *argv], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=_limits, start_new_session=True)
        deadline = time.monotonic() + BOUND_S
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                proc.returncode = -9
                pytest.fail(f"{argv}: still running after {BOUND_S} s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return proc.returncode, err.read().decode(errors="replace"), usage.ru_maxrss * 1024


# (argv, what the one line must hold: the input, then words of the reason). {d} is the hostile directory.
CASES = [
    # paths that are not regular files, read by diagnose, lint, sim from-trace, bench --baseline
    (["diagnose", "/dev/zero"], ["/dev/zero", "character device"]),
    (["diagnose", "{d}/fifo"], ["fifo", "FIFO"]),
    (["diagnose", "{d}/loop"], ["loop", "symbolic link loop"]),
    (["diagnose", "{d}/dangling"], ["dangling", "dangling symbolic link"]),
    (["diagnose", "{d}/sparse"], ["sparse", "NUL bytes", "sparse file"]),
    (["diagnose", "{d}/zeros"], ["zeros", "NUL bytes"]),
    (["diagnose", "{d}/nosuch"], ["nosuch", "no such file"]),
    (["diagnose", "{d}/mixed"], ["mixed/core", "NUL bytes", "move it out"]),
    (["lint", "{d}/mixed"], ["mixed/core", "NUL bytes"]),
    (["lint", "/dev/zero"], ["/dev/zero", "character device"]),
    (["lint", "{d}/fifo"], ["fifo", "FIFO"]),
    (["lint", "{d}/sparse"], ["sparse", "NUL bytes"]),
    (["sim", "from-trace", "/dev/zero"], ["/dev/zero", "character device"]),
    (["sim", "from-trace", "{d}/loop"], ["loop", "symbolic link loop"]),
    (["bench", "--baseline", "/dev/zero"], ["/dev/zero", "character device"]),
    (["bench", "--baseline", "{d}/fifo"], ["fifo", "FIFO"]),
    (["bench", "--baseline", "{d}/sparse"], ["sparse", "limit"]),
    (["bench", "--baseline", "{d}/loop"], ["loop", "symbolic link loop"]),
    (["sim", "run", "/dev/zero"], ["/dev/zero", "character device"]),
    (["sim", "run", "{d}/fifo"], ["fifo", "FIFO"]),
    (["sim", "run", "{d}/loop"], ["loop", "symbolic link loop"]),
    (["sim", "run", "{d}/sparse"], ["sparse", "limit"]),
    (["sim", "run", "{d}/bomb.yaml"], ["bomb.yaml"]),
    (["sim", "torch-schedule", "--csv", "/dev/zero"], ["/dev/zero", "character device"]),
    # traces whose numbers are impossible, in each format
    (["diagnose", "{d}/ws_neg_rank_1.jsonl"], ["ws_neg_rank_1.jsonl", "world_size -4"]),
    (["diagnose", "{d}/seq_neg_rank_1.jsonl"], ["seq_neg_rank_1.jsonl", "seq -5"]),
    (["diagnose", "{d}/rank_neg.jsonl"], ["rank_neg.jsonl", "rank -3"]),
    (["lint", "{d}/seq_huge_rank_1.jsonl"], ["seq_huge_rank_1.jsonl", "seq 9", "64-bit"]),
    (["lint", "{d}/fr_huge_rank_0"], ["fr_huge_rank_0", "collective_seq_id", "64-bit"]),
    (["lint", "{d}/fr_huge_rank_0.json"], ["fr_huge_rank_0.json", "collective_seq_id", "64-bit"]),
    (["diagnose", "{d}/fr_neg_rank_0.json"], ["fr_neg_rank_0.json", "seq -5"]),
    # numbers: NaN, infinity, negative, past the cap, each kind of option
    (["sim", "pipeline", "--fwd-us", "nan"], ["--fwd-us", "finite"]),
    (["sim", "pipeline", "--fwd-us", "inf"], ["--fwd-us", "finite"]),
    (["sim", "pipeline", "--bwd-us", "1e400"], ["--bwd-us", "finite"]),
    (["sim", "pipeline", "--fwd-us", "-1"], ["--fwd-us", ">= 0"]),
    (["sim", "pipeline", "--act-bytes", "-1"], ["--act-bytes", "negative"]),
    (["sim", "pipeline", "--gbps", "0"], ["--gbps", "positive"]),
    (["sim", "pipeline", "--stages", "100000"], ["--stages", "up to"]),
    (["sim", "pipeline", "--steps", "1000000000"], ["--steps", "up to"]),
    (["sim", "fsdp", "--compute-us", "nan"], ["--compute-us", "finite"]),
    (["sim", "fsdp", "--ranks", "1000000000"], ["--ranks", "up to"]),
    (["sim", "fsdp", "--ranks", "65536", "--units", "65536"], ["--ranks x --units", "ops"]),
    (["sim", "pipeline", "--stages", "4096", "--microbatches", "65536"], ["--stages x --microbatches", "ops"]),
    (["sim", "pipeline", "--dp", "65536", "--tp", "65536"], ["--dp x --tp", "ops"]),
    (["sim", "run", "c-groups-out-of-order", "--trials", "1000000000"], ["--trials", "up to"]),
    (["sim", "run", "c-groups-out-of-order", "--jitter", "nan"], ["--jitter", "finite"]),
    (["sim", "torch-schedule", "1F1B", "--p2p-us", "inf"], ["--p2p-us", "finite"]),
    (["sim", "torch-schedule", "Bogus"], ["Bogus", "unknown torch pipeline schedule"]),
    (["sim", "torch-schedule", "GPipe", "--stages", "4096", "--microbatches", "65536"], ["--stages x", "ops"]),
    (["bench", "--min-busbw", "nan"], ["--min-busbw", "finite"]),
    (["bench", "--min-busbw", "-1"], ["--min-busbw", ">= 0"]),
    (["bench", "--tolerance", "nan"], ["--tolerance", "finite"]),
    (["bench", "--timeout", "inf"], ["--timeout", "finite"]),
    (["bench", "--timeout", "nan"], ["--timeout", "finite"]),
    (["bench", "-n", "1000000000000"], ["--iters", "up to"]),
    (["bench", "-e", "100G", "--nproc", "2"], ["--maxbytes", "available"]),
    (["validate", "--straggler-threshold", "nan"], ["--straggler-threshold", "finite"]),
    (["validate", "--straggler-threshold", "0"], ["--straggler-threshold", "positive"]),
    (["validate", "--timeout", "1e400"], ["--timeout", "finite"]),
    (["validate", "--sizes", "100G", "--nproc", "2"], ["--sizes", "available"]),
    (["validate", "--nproc", "5000"], ["--nproc", "up to"]),
    (["validate", "--nproc", "4", "--sizes", ",".join(["1"] * 3000)], ["--sizes", "checks planned"]),
    (["validate", "--seed", "-1"], ["--seed", ">= 0"]),
    (["check", "--nproc", "5000"], ["--nproc", "up to"]),
    (["scaling", "--max-ranks", "100000"], ["--max-ranks", "up to"]),
    (["parity", "--lr", "nan"], ["--lr", "finite"]),
    (["parity", "--rtol", "inf"], ["--rtol", "finite"]),
    (["diagnose", "--world-size", "1000000000000", "x"], ["--world-size", "up to"]),
    (["lint", "--world-size", "-1", "x"], ["--world-size", ">= 1"]),
    (["run", "--hang-timeout", "nan", "--", "true"], ["--hang-timeout", "finite"]),
    (["run", "--hang-timeout", "inf", "--", "true"], ["--hang-timeout", "finite"]),
    (["run", "--suspect-floor", "nan", "--", "true"], ["--suspect-floor", "finite"]),
    (["run", "--suspect-factor", "inf", "--", "true"], ["--suspect-factor", "finite"]),
    (["run", "--buffer", "100000000000", "--", "true"], ["--buffer", "up to"]),
    # run's own options end at `--`: an unknown one is run's error, not a command to run
    (["run", "--bogus", "--", "true"], ["--bogus", "No such option"]),
]


@pytest.mark.parametrize("argv, needles", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_hostile_input_is_one_line(argv, needles, hostile, tmp_path):
    argv = [a.format(d=hostile) for a in argv]
    rc, err, rss = run_bounded(argv, tmp_path)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (argv, rc, err[-2000:])
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("distdoctor") and ": error: " in lines[0], err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert rss < MAX_RSS, f"{argv}: peak resident memory {rss >> 20} MB"
    assert not (tmp_path / "distdoctor-dumps").exists(), "run refused its options but made a dump directory"


# ---------------------------------------------------------------------------------------------- every option
def _commands(group: click.Group, path=()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


COMMANDS = list(_commands(cli.cli))


def _capped(t) -> bool:
    if isinstance(t, Number):
        return t.integer is False or t.high is not None
    if isinstance(t, (click.IntRange, click.FloatRange)):
        return t.min is not None and t.max is not None and not isinstance(t, click.FloatRange)
    return isinstance(t, ByteSize) or not isinstance(t, (click.types.IntParamType, click.types.FloatParamType))


def test_no_option_takes_a_bare_float_or_an_uncapped_count():
    loose = [f"{' '.join(path)} {p.opts[0]}: {p.type!r}" for path, cmd in COMMANDS for p in cmd.params
             if not _capped(p.type)]
    assert not loose, "declare these with distdoctor.options (finite, in range, capped):\n" + "\n".join(loose)


NUMBER_OPTIONS = [(path, p.opts[0]) for path, cmd in COMMANDS for p in cmd.params
                  if isinstance(p, click.Option) and isinstance(p.type, Number)]


@pytest.mark.parametrize("path, opt", NUMBER_OPTIONS, ids=[f"{' '.join(p)} {o}" for p, o in NUMBER_OPTIONS])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "x"])
def test_every_number_option_refuses_what_is_not_a_finite_number(path, opt, value):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        with pytest.raises(SystemExit) as exc:
            cli.main([*path, opt, value])
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert exc.value.code == 2 and len(lines) == 1 and opt in lines[0], (path, opt, value, err.getvalue())
