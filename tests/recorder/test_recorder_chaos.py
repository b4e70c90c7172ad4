"""Chaos on one rank of a plain 4-rank DDP job (fuzz/jobs.py ddp: buckets, no_sync, find_unused_parameters; and
of a tensor-parallel one, whose collectives only Flight Recorder sees) under `distdoctor run --inject`: SIGKILL,
SIGSTOP, SIGSEGV, SIGTERM, a rank that stops and then the job is stopped, Ctrl-C to the whole group after a hang. Every time that rank is the first finding of the closing verdict,
and the only rank `run`'s closing line names (the ranks that died after it, of a closed connection or the
launcher's SIGTERM, are counted, never named)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from recorder_helpers import as_foreground, free_port, kill_job_processes

pytestmark = pytest.mark.slow

JOBS = Path(__file__).resolve().parents[2] / "fuzz" / "jobs.py"
FIRST = re.compile(r"^1\. (\w+): ranks \[([\d, ]*)\]", re.MULTILINE)


KILL_GRACE_S = 10  # --kill-grace: a stopped rank ignores torchrun's SIGTERM; the default 30 s is only waiting


def chaos(tmp_path, cli_env, spec: str, ctrl_c: bool = False, program: str = "ddp"):
    dumps = tmp_path / "dumps"
    cmd = [sys.executable, "-m", "distdoctor", "run", "--dump-dir", str(dumps), "--suspect-floor", "2",
           "--hang-timeout", "60" if ctrl_c else "8",
           *([] if ctrl_c else ["--kill-on-hang", "--kill-grace", str(KILL_GRACE_S)]), "--inject", spec,
           "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr",
           "127.0.0.1", "--master-port", str(free_port()), str(JOBS), program, "6"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(cli_env, OMP_NUM_THREADS="1"), preexec_fn=as_foreground)
    try:
        head = ""
        if ctrl_c:  # a terminal's Ctrl-C once the hang is reported: SIGINT to the group and to every rank
            for line in proc.stdout:
                head += line
                if "HANG SUSPECTED" in line:
                    break
            pids = [int((p.read_text().split() or ["0"])[0]) for p in dumps.glob(".rank_*.pid")]
            os.killpg(proc.pid, signal.SIGINT)
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGINT)
                except OSError:
                    pass
        out, err = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        orphans = kill_job_processes(dumps)
    assert orphans == [] or ctrl_c, f"ranks outlived distdoctor run: {orphans}"
    truth = json.loads((dumps / ".injected.json").read_text())
    return head + out, err, truth


@pytest.mark.parametrize("program, spec", [
    ("ddp", "kill:1:SIGKILL@step=3"), ("ddp", "kill:2:SIGSEGV@step=2"), ("ddp", "kill:3:SIGTERM@step=3"),
    ("ddp", "kill:0:SIGSTOP@step=3"), ("ddp", "hang:2@step=3"),
    # tensor parallel: the ranks wait in collectives only Flight Recorder sees (DTensor's, issued from C++); a
    # rank asked to join the hang once read the calls issued before the stall as a resume, and run never stopped
    # the job
    ("tp", "kill:2:SIGSTOP@step=3")])
def test_the_rank_that_chaos_hit_is_first_and_alone(tmp_path, cli_env, program, spec):
    rank = int(spec.split(":")[1].split("@")[0])
    out, err, truth = chaos(tmp_path, cli_env, spec, program=program)
    assert [f["rank"] for f in truth["fired"]] == [rank], truth
    firsts = FIRST.findall(out)
    assert firsts, out[-3000:]
    kind, ranks = firsts[-1]  # the closing verdict
    assert ranks == str(rank), (kind, ranks, out[-3000:])
    closing = next(ln for ln in out.splitlines() if ln.startswith("distdoctor run: the job failed"))
    named = {int(n) for grp in re.findall(r"ranks? ([\d, -]+)", closing) for n in re.findall(r"\d+", grp)}
    assert named == {rank} and closing.startswith(f"distdoctor run: the job failed: rank {rank}"), closing
    if "SIGKILL" in spec or "SIGSEGV" in spec:  # torchrun's account passed through, and kept beside the dumps
        log = tmp_path / "dumps" / "launcher.log"
        assert "Root Cause (first observed failure)" in err and log.exists(), err[-3000:]
        assert spec.split(":")[2].split("@")[0] in log.read_text() and f"launcher's log ({log})" in out, out[-3000:]
    if "SIGSTOP" in spec:  # torchrun waits 30 s for the stopped rank; run kills it all after --kill-grace
        assert f"the command did not stop within {KILL_GRACE_S} s of SIGTERM: killing it and its ranks" in err, err


def test_ctrl_c_to_the_whole_group_after_a_hang_blames_the_rank_that_stopped(tmp_path, cli_env):
    out, err, truth = chaos(tmp_path, cli_env, "hang:1@step=3", ctrl_c=True)
    firsts = FIRST.findall(out)
    assert firsts and all(ranks == "1" for _, ranks in firsts), out[-3000:]  # live and closing alike
    closing = next(ln for ln in out.splitlines() if ln.startswith("distdoctor run: the job failed"))
    assert closing.startswith("distdoctor run: the job failed: rank 1") and "rank 0" not in closing \
        and "rank 2" not in closing and "rank 3" not in closing, closing
