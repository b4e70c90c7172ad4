"""The live path on one host: a 3-rank job with the recorder enabled in code (no distdoctor run), rank 1 stopped
outside collectives. `diagnose --live` and `watch --once` read every rank through torch's worker servers and the
job's TCPStore and name rank 1; the metrics say suspected; the servers listen on the job's address only; bad
endpoints are one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recorder_helpers import free_port, kill_group, kill_job_processes

pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "workers" / "live_job.py"


def _stop(proc: subprocess.Popen, marker: Path) -> None:
    """torchrun and its workers (each in a session of its own: found by the marker in their environment)."""
    kill_group(proc)
    kill_job_processes(marker)


@pytest.fixture(scope="module")
def stopped_job(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    port = free_port()
    env = dict(os.environ, DUMP_DIR=str(tmp / "dumps"), DISTDOCTOR_DUMP_DIR=str(tmp / "dumps"), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr",
                             "127.0.0.1", "--master-port", str(port), str(JOB)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while "STOP" not in proc.stdout.readline():
            assert proc.poll() is None and time.time() < deadline, "the job ended before rank 1 stopped"
        time.sleep(4)  # past the 2 s suspect floor
        yield port
    finally:
        _stop(proc, tmp / "dumps")


def _cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "distdoctor", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_diagnose_live_names_the_stopped_rank(stopped_job):
    done = _cli("diagnose", "--live", f"127.0.0.1:{stopped_job}", "--format", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["world_size"] == 3 and report["live"]["not_answering"] == []
    first = report["findings"][0]
    assert first["kind"] == "missing_ranks" and first["ranks"] == [1], report["findings"]
    assert "wait_for_the_next_batch" in done.stdout  # rank 1's own stack, served live


def test_watch_once_prints_the_verdict_and_the_metrics(stopped_job, tmp_path):
    metrics = tmp_path / "m.prom"
    done = _cli("watch", "--master-addr", "127.0.0.1", "--master-port", str(stopped_job), "--once",
                "--metrics-file", str(metrics), "--job-name", "t")
    assert done.returncode == 1, done.stderr
    assert "distdoctor watch: HANG SUSPECTED" in done.stdout
    assert "1. missing_ranks: ranks [1] at all_reduce #11" in done.stdout, done.stdout
    text = metrics.read_text()
    assert 'distdoctor_hang_state{job="t"} 1' in text
    assert text.count("distdoctor_rank_up{") == 3 and 'distdoctor_rank_hang_state{job="t",rank="1",' in text
    assert 'distdoctor_rank_collectives_completed{job="t",rank="1",host="' in text and '",group="0"} 10' in text


def test_servers_listen_on_the_jobs_address_only(stopped_job):
    """Every worker server the job's ranks registered listens on 127.0.0.1 (the route to MASTER_ADDR), nowhere
    else: read back from the kernel's socket table."""
    from distdoctor.diagnose import live

    job = live.discover(live.connect("127.0.0.1", stopped_job), "127.0.0.1", stopped_job)
    ports = {int(r.url.rsplit(":", 1)[1]) for r in job.ranks.values()}
    assert len(ports) == 3 and all(r.url.startswith("http://127.0.0.1:") for r in job.ranks.values())
    listening = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A":  # LISTEN
                addr, port = local.split(":")
                listening.setdefault(int(port, 16), set()).add(addr)
    assert all(listening.get(p) == {"0100007F"} for p in ports), {p: listening.get(p) for p in ports}


def _torch_debug_server_missing() -> str | None:
    """torch's start_debug_server imports its frontend's optional dependencies in rank 0."""
    import importlib.util

    missing = [m for m in ("jinja2", "tabulate") if importlib.util.find_spec(m) is None]
    return f"torch's debug server needs {', '.join(missing)}" if missing else None


@pytest.mark.skipif(_torch_debug_server_missing() is not None, reason=str(_torch_debug_server_missing()))
def test_diagnose_live_on_a_job_under_torchs_debug_server_only(tmp_path):
    """Never under distdoctor: the ranks are read through torch's own handlers (Flight Recorder in C++, py-spy)."""
    port = free_port()
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="200", FRONTEND_PORT=str(free_port()), OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", DISTDOCTOR_DUMP_DIR=str(tmp_path / "marker"))
    env.pop("DISTDOCTOR_TRACE", None)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr",
                             "127.0.0.1", "--master-port", str(port), str(JOB.parent / "debug_server_job.py")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while "STOP" not in proc.stdout.readline():
            assert proc.poll() is None and time.time() < deadline, "the job ended before rank 2 stopped"
        time.sleep(2)
        done = _cli("diagnose", "--live", f"127.0.0.1:{port}")
    finally:
        _stop(proc, tmp_path / "marker")
    assert done.returncode == 1, done.stderr
    assert "1. missing_ranks: ranks [2] at all_reduce #11" in done.stdout, done.stdout
    assert "did not answer" not in done.stdout  # each answered, through torch's handlers


def test_a_running_job_read_live_gets_no_verdict(tmp_path):
    """Ranks read at different moments of a job that runs are no single picture (one would seem to lag behind
    the other): diagnose --live reads every rank twice and, when ranks moved in between, says so, exit 0. A job
    that ends is not a hang either: `watch` says it ended and exits 0."""
    port = free_port()
    env = dict(os.environ, DUMP_DIR=str(tmp_path / "dumps"), DISTDOCTOR_DUMP_DIR=str(tmp_path / "dumps"),
               STOP_STEP=str(10**9), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr",
                             "127.0.0.1", "--master-port", str(port), str(JOB)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        from distdoctor.diagnose import live

        deadline = time.time() + 120
        while True:  # until both ranks registered
            try:
                if len(live.discover(live.connect("127.0.0.1", port), "127.0.0.1", port).ranks) == 2:
                    break
            except Exception:
                pass
            assert proc.poll() is None and time.time() < deadline, "the job did not come up"
            time.sleep(1)
        done = _cli("diagnose", "--live", f"127.0.0.1:{port}")
        watch = subprocess.Popen([sys.executable, "-m", "distdoctor", "watch", "--master-addr", "127.0.0.1",
                                  "--master-port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        first = watch.stderr.readline()  # it prints this once it knows every rank
        assert "watching 2 ranks" in first, first
        time.sleep(2)
    finally:
        _stop(proc, tmp_path / "dumps")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stdout.startswith("verdict: NONE - the job is moving: ranks 0, 1"), done.stdout
    # the job ends (every rank at once): the watcher says so and stops; an ended job is no hang
    out, err = watch.communicate(timeout=60)
    assert watch.returncode == 0 and "HANG" not in out, (out, first + err)
    assert "the job has ended" in err, err


def test_bad_endpoints_are_one_line(tmp_path):
    done = _cli("diagnose", "--live", "nowhere")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "HOST:PORT" in done.stderr, done.stderr
    done = _cli("diagnose", "--live", f"127.0.0.1:{free_port()}", timeout=60)
    assert done.returncode == 2 and "no job store answers there" in done.stderr.splitlines()[-1], done.stderr
    done = _cli("diagnose", str(tmp_path), "--live", "127.0.0.1:1")
    assert done.returncode == 2 and "not both" in done.stderr
