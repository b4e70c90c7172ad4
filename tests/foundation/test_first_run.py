"""A clean first run: what a new user meets in the first minutes, each case seen on a fresh clone (issue 14)."""

import json
import sys
import time
import tomllib
from pathlib import Path

import click
import pytest

from world_helpers import distdoctor

ROOT = Path(__file__).resolve().parents[2]


def one_line_error(out, *fragments):
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert out.stdout == "" and out.stderr.strip().count("\n") == 0, out.stderr
    assert "Traceback" not in out.stderr
    for fragment in fragments:
        assert fragment in out.stderr, out.stderr


@pytest.mark.parametrize("args", [[], ["sim"]])
def test_no_arguments_prints_the_help(args):
    out = distdoctor(*args, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Usage: distdoctor") and "Commands:" in out.stdout
    assert out.stderr == ""


def test_short_version_flag():
    from distdoctor import __version__

    for flag in ("-V", "--version"):
        out = distdoctor(flag, timeout=60)
        assert out.returncode == 0 and out.stdout.strip() == f"distdoctor, version {__version__}"


def _commands():
    from distdoctor.cli import SUBCOMMANDS, cli
    from distdoctor.health.demo import demo_command

    ctx = click.Context(cli)
    for name in SUBCOMMANDS:
        cmd = cli.get_command(ctx, name)
        if isinstance(cmd, click.Group):
            for sub in cmd.list_commands(ctx):
                yield f"{name} {sub}", cmd.get_command(ctx, sub)
        else:
            yield name, cmd
    yield "python -m distdoctor.health.demo", demo_command


def test_every_option_has_help_text():
    missing = [f"{name} {param.opts[0]}" for name, cmd in _commands() for param in cmd.params
               if isinstance(param, click.Option) and not (param.help or "").strip()]
    assert missing == []


def test_parity_refuses_a_negative_tolerance(capsys):
    from distdoctor.cli import main

    for args, flag in ((["--rtol", "-1"], "--rtol"), (["--atol", "-1"], "--atol"), (["--lr", "0"], "--lr")):
        with pytest.raises(SystemExit) as exit_:
            main(["parity", *args])  # refused while parsing: no world starts
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and flag in err and "Traceback" not in err


def test_health_demo_refuses_nproc_0_and_has_short_help(capsys, monkeypatch):
    from distdoctor.health import demo

    for args, code in ((["--nproc", "0"], 2), (["-h"], None)):
        monkeypatch.setattr(sys, "argv", ["demo", *args])
        with pytest.raises(SystemExit) as exit_:
            demo.main()
            sys.exit(None)  # -h returns normally from main()
        assert exit_.value.code in (code, 0)
    out = capsys.readouterr()
    assert out.err.strip() == "distdoctor.health.demo: error: --nproc: a world needs at least 2 ranks, got 0"
    assert out.out.startswith("Usage:") and "--inject" in out.out


def test_bench_refuses_a_root_outside_the_world():
    out = distdoctor("bench", "--nproc", "4", "--op", "broadcast", "-r", "7", timeout=60)
    one_line_error(out, "-r/--root: rank 7 does not exist in a world of 4 ranks")


def test_bench_refuses_buffers_beyond_the_memory_with_the_numbers():
    start = time.monotonic()
    out = distdoctor("bench", "--nproc", "4", "-e", "100G", timeout=60)
    assert time.monotonic() - start < 30  # refused before any rank starts, not after the kernel kills one
    one_line_error(out, "-e/--maxbytes: 107374182400 B of all_reduce float32 needs about", "x 4 ranks on this host",
                   "is available (MemAvailable): use -e ")


def test_memory_estimate_grows_with_the_size_and_the_check():
    from distdoctor.bench.sweep import rank_bytes

    small, big = rank_bytes("all_reduce", 1 << 20, "float32", 4, True), rank_bytes("all_reduce", 1 << 30, "float32",
                                                                                   4, True)
    assert big == small * 1024 and small >= 2 * (1 << 20)  # at least the input and output buffers
    assert rank_bytes("all_reduce", 1 << 20, "float32", 4, False) < small
    assert rank_bytes("all_gather", 1 << 20, "float32", 4, True) >= 2 * (1 << 20)


def test_validate_refuses_an_address_of_another_host_at_once():
    # 192.0.2.1 (TEST-NET-1) is no address of this host: a standalone world could never meet there.
    start = time.monotonic()
    out = distdoctor("validate", "--nproc", "2", "--master-addr", "192.0.2.1", "--timeout", "5", timeout=60)
    assert time.monotonic() - start < 30
    one_line_error(out, "--master-addr: 192.0.2.1 is not an address of this host")
    assert "frame #" not in out.stderr


def test_validate_refuses_a_busy_port():
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = distdoctor("validate", "--nproc", "2", "--master-port", port, timeout=60)
    one_line_error(out, f"--master-port: port {port} on 127.0.0.1 is in use")


def test_packaging_metadata():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["license"] == "Apache-2.0"  # an SPDX expression, not the table form
    assert project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "END OF TERMS AND CONDITIONS" in (ROOT / "LICENSE").read_text()
    assert {"Homepage", "Source", "Issues"} <= set(project["urls"])
    assert any(c.startswith("Topic :: System :: Distributed Computing") for c in project["classifiers"])
    assert not any(c.startswith("License ::") for c in project["classifiers"])  # PEP 639: the expression only
    assert int(meta["build-system"]["requires"][0].split(">=")[1]) >= 77
    assert {"nbclient", "nbformat", "ipykernel"} <= {d.split(">")[0] for d in project["optional-dependencies"]["test"]}


def test_readme_says_how_a_cpu_machine_gets_the_cpu_wheel():
    readme = (ROOT / "README.md").read_text()
    assert "download.pytorch.org/whl/cpu" in readme
    assert "On a CPU-only machine `torch==2.13.0` is the CPU build" not in readme
    quick = readme.split("## Quickstart", 1)[1].split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(quick) == 2 and quick[0].endswith("distdoctor check")
    ci = (ROOT / ".ci" / "run").read_text()
    assert quick[1] in ci  # CI runs the README's test line verbatim


def test_diagnose_reads_only_the_directory_and_summarizes_what_it_skips(tmp_path):
    from distdoctor.diagnose.command import diagnose_command
    from click.testing import CliRunner

    dumps = ROOT / "tests" / "doctor" / "fixtures" / "nccl_style"
    top = tmp_path / "job"
    (top / "deep" / "deeper").mkdir(parents=True)
    for f in dumps.iterdir():
        (top / f.name).write_bytes(f.read_bytes())
    for i in range(40):
        (top / f"notes{i}.txt").write_text("not a trace\n")
    (top / "config.json").write_text(json.dumps({"lr": 0.1}))
    # A trace of rank 7 in a subdirectory: read only with --recursive.
    (top / "deep" / "deeper" / "nccl_trace_rank_7").write_bytes((dumps / "nccl_trace_rank_0").read_bytes())

    out = CliRunner().invoke(diagnose_command, [str(top), "--format", "json"])
    doc = json.loads(out.stdout)
    notes = [line for line in out.stderr.splitlines() if "not traces" in line]
    assert len(notes) == 1, out.stderr
    assert "skipped 41 file(s) that are not traces (40 not a trace format, 1 JSON but not a trace" in notes[0]
    assert "did not read 1 subdirectory (--recursive reads them)" in notes[0]
    assert not any(line.startswith("distdoctor diagnose: warning") and "notes" in line
                   for line in out.stderr.splitlines())
    assert all("deeper" not in e["path"] for e in doc["load_errors"])
    assert any(e["path"].endswith("deep") for e in doc["load_errors"])

    deep = CliRunner().invoke(diagnose_command, [str(top), "--format", "json", "--recursive"])
    assert doc["world_size"] == 4
    recursive = json.loads(deep.stdout)
    assert recursive["world_size"] == 8  # rank 7's dump was read this time
    assert not any(e["path"].endswith("deep") for e in recursive["load_errors"])


@pytest.mark.slow
def test_the_documented_straggler_is_named_and_every_result_stays_pass(tmp_path):
    # 16 calls on the 2-rank shard groups: without validate's lockstep, ranks 2 and 3 run 3.2 s ahead of the
    # delayed rank 1 and time out (--timeout 2.5) waiting for it in the next group; then ranks were named lost.
    # With it they are at most 8 calls (1.6 s) ahead.
    out = distdoctor("validate", "--nproc", "4", "--ops", "all_reduce,all_gather", "--dtypes",
                     "float32,float64", "--sizes", "1", "--inject", "delay:1:0.2", "--timeout", "2.5", "--format",
                     "json", "--html", tmp_path / "validate.html", timeout=180)
    doc = json.loads(out.stdout)
    assert out.returncode == 1, out.stderr[-2000:]  # a straggler fails the run...
    assert doc["lost"] == [] and doc["counts"]["fail"] == 0  # ...while every result is right
    assert [s["rank"] for s in doc["stragglers"]] == [1] and doc["culprit_ranks"] == [1]
    assert 0.15 <= doc["stragglers"][0]["median_late_s"] < 1.0
    assert doc["per_rank_late_s"]["1"] == pytest.approx(doc["stragglers"][0]["median_late_s"], abs=1e-4)
    # The page of the same run, in a real browser: it loads cleanly and names the straggler.
    from chromium_cdp import errors, find_browser, load_page

    if find_browser() is None:
        pytest.skip("no chromium on this machine (Debian: apt-get install chromium) to load the page in")
    page = load_page(str(tmp_path / "validate.html"))
    assert errors(page) == []
    assert "rank 1: straggler: arrives" in page["text"] and "median lateness at the barrier" in page["text"]
