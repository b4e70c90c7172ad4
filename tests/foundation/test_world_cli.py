"""The world's flags, `distdoctor env` and `distdoctor check` from the command line."""

import json

import pytest

from world_helpers import distdoctor


@pytest.mark.parametrize("args,what", [
    (["--nproc", "1"], "--nproc: a world needs at least 2 ranks, got 1"),
    (["--nproc", "-3"], "--nproc: a world needs at least 2 ranks, got -3"),
    (["--timeout", "0"], "--timeout: must be a positive number of seconds"),
    (["--iface", "no-such-if0"], "--iface: no network interface named 'no-such-if0'"),
    (["--master-port", "70000"], "--master-port: must be a TCP port"),
    (["--inject", "explode:1"], "distdoctor check: error: --inject"),
])
def test_bad_world_input_is_one_line(args, what):
    out = distdoctor("check", *args, timeout=120)
    assert out.returncode == 2
    assert out.stdout == ""
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert what in out.stderr and "Traceback" not in out.stderr


def test_env_json_has_the_fields():
    out = distdoctor("env", "--format", "json", timeout=120)
    assert out.returncode == 0, out.stderr
    env = json.loads(out.stdout)
    import torch

    assert env["torch_version"] == torch.__version__
    assert env["backends"]["gloo"] is True and set(env["backends"]) >= {"gloo", "nccl", "mpi", "xccl"}
    assert env["device_type"] in ("cpu", "cuda") and env["device_count"] == len(env["device_names"])
    assert env["cpu_count"] >= 1
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert env["mode"] == ("nccl: real multi-GPU" if gpus >= 2 else "gloo: CPU processes")
    assert "nccl_version" in env and (env["nccl_version"] is None) == (gpus == 0)


def test_env_text_names_the_mode():
    from click.testing import CliRunner

    from distdoctor.world.env import env_command

    out = CliRunner().invoke(env_command, [])
    assert out.exit_code == 0 and out.output.startswith("mode ") and "\ntorch " in out.output


@pytest.mark.slow
def test_check_passes_on_the_default_world():
    out = distdoctor("check", "--format", "json", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)  # one document, nothing else on stdout
    assert doc["passed"] and doc["verdict"].startswith("PASS")
    assert doc["world_size"] == doc["env"]["default_nproc"] and doc["lost"] == []
    assert doc["validate"]["passed"] and doc["validate"]["world_size"] == doc["world_size"]
    statuses = {r["status"] for r in doc["validate"]["results"]}
    assert "pass" in statuses and "fail" not in statuses
    assert {r["group"].split("[")[0] for r in doc["validate"]["results"]} >= {"world"}
    assert doc["bench"]["rows"] and all(r["wrong"] == 0 and r["busbw_gbps"] > 0 for r in doc["bench"]["rows"])
    assert doc["bench"]["avg_busbw_gbps"] > 0
    assert out.leftover == []


@pytest.mark.slow
def test_check_fails_and_names_a_crashed_rank(tmp_path):
    out = distdoctor("check", "--inject", "crash:1", "--timeout", "20", "--html", tmp_path / "check.html",
                     timeout=300)
    assert out.returncode == 1
    first = out.stdout.splitlines()[0]
    assert first.startswith("FAIL") and "rank 1 lost" in first
    assert out.leftover == []
    page = (tmp_path / "check.html").read_text()  # the page says what the text says
    assert "<h1>distdoctor check</h1>" in page and "rank 1 lost" in page and "lost rank" in page


def test_gloo_interface_follows_the_route_to_the_master():
    from distdoctor.world import interface_address, pick_iface

    assert pick_iface("127.0.0.1") == "lo"  # a local world stays on loopback
    chosen = pick_iface("127.0.0.1", multi_host=True)  # a master name that resolves to loopback, many hosts
    assert chosen is None or not interface_address(chosen).startswith("127.")


def test_world_config_defaults_and_validation():
    from distdoctor.errors import InputError
    from distdoctor.world import WorldConfig, config_from_options

    assert config_from_options() == WorldConfig()
    assert config_from_options(nproc=3, timeout=5, iface="lo").timeout_s == 5.0
    with pytest.raises(InputError, match="at least 2 ranks, got 0"):
        config_from_options(nproc=0)
    with pytest.raises(InputError, match="--master-addr"):
        config_from_options(master_addr="no-such-host.invalid")
