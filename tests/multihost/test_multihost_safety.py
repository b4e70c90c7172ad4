"""Safety defaults: a standalone world listens on loopback only; HTML reports escape what dumps contain."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from distdoctor.trace.model import Entry, Frame, GroupInfo, RankTrace, dumps

from mh_helpers import Job, scenario, wait_for

EVIL = "<script>alert('x')</script>"


def _listening(netns_name: str) -> set[str]:
    """Local addresses of every listening TCP socket in the namespace (IPv4 and IPv6)."""
    addrs = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        out = subprocess.run(["ip", "netns", "exec", netns_name, "cat", table], capture_output=True, text=True)
        for line in out.stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) > 3 and parts[3] == "0A":  # TCP_LISTEN
                addrs.add(parts[1].split(":")[0])
    return addrs


@scenario
def standalone_world(cluster, tmp_path, idle) -> SimpleNamespace:
    """A standalone validate alone in a host (its namespace has a loopback and a routable link); every listening
    socket there is sampled while the ranks are in their collectives."""
    argv = [sys.executable, "-m", "distdoctor", "validate", "--nproc", "2", "--ops", "all_reduce", "--dtypes",
            "float32", "--sizes", "1", "--no-subgroups", "--inject", "delay:1:0.5", "--timeout", "20"]
    job = Job(cluster).start({0: argv})
    seen: set[str] = set()

    def sample() -> bool:
        seen.update(_listening(cluster.hosts[0].netns))
        return job.results[0].returncode is not None

    wait_for(sample, 120, interval=0.2)
    (res,) = job.wait(120)
    return SimpleNamespace(res=res, seen=seen)


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.scenario("standalone_world")
def test_standalone_world_listens_on_loopback_only(scenarios):
    s = scenarios.result("standalone_world")
    assert s.res.returncode == 1, s.res.text()  # the delay makes rank 1 a straggler: reported, non-zero
    assert "straggler" in s.res.text(), s.res.text()
    assert s.seen, "no listening socket was ever seen: the sampling missed the run"
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc/net shows them
    assert s.seen <= loopback, f"sockets listening beyond loopback: {s.seen - loopback}"


def _evil_trace(rank: int) -> RankTrace:
    frames = [Frame(EVIL, f"/tmp/{EVIL}.py", 1)]
    entries = [Entry(0, "0", "all_reduce", seq=1, state="completed", frames=frames, stream=EVIL),
               Entry(1, "0", f"other:{EVIL}", seq=2, raw_op=EVIL, state="started" if rank == 0 else "completed",
                     frames=frames)]
    if rank == 0:
        entries.append(Entry(2, "0", "all_reduce", seq=3, state="started", frames=frames))
    return RankTrace(rank=rank, source="native", world_size=3, host=EVIL, dump_reason=EVIL,
                     groups={"0": GroupInfo("0", [0, 1, 2], desc=EVIL)}, entries=entries,
                     stacks={EVIL: frames})


def test_html_report_escapes_dump_strings(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank_{r}.jsonl").write_text(dumps(_evil_trace(r)))
    out = subprocess.run([sys.executable, "-m", "distdoctor", "diagnose", str(tmp_path), "--format", "html"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    html = out.stdout
    assert "<html" in html.lower()
    assert "&lt;script&gt;alert(" in html  # the strings are shown, escaped ...
    assert EVIL not in html and "<script>alert" not in html  # ... never as live markup
    assert html.lower().count("<script") == html.lower().count("</script>")  # no tag opened by dump data
