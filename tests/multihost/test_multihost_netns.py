"""The virtual-host fixture itself: hosts reach each other only over their link, faults act, cleanup is total."""

from __future__ import annotations

import subprocess
import sys

import pytest

from distdoctor.testing import netns

from mh_helpers import wait_for

ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 29399)); s.listen(); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.sendall(c.recv(100)); c.close()
"""
ECHO_CLIENT = """
import socket, sys
s = socket.create_connection((sys.argv[1], 29399), timeout=float(sys.argv[2])); s.sendall(b"ping"); print(s.recv(100).decode())
"""


def _run_in(c, host, code, *args, timeout=30):
    return subprocess.run(["ip", "netns", "exec", c.hosts[host].netns, sys.executable, "-c", code, *args],
                          capture_output=True, text=True, timeout=timeout)


def _start_echo(c):
    server = c.popen(1, [sys.executable, "-c", ECHO_SERVER, c.hosts[1].addr], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    return server


def test_hosts_talk_over_their_link_and_cleanup_leaves_nothing(netns_ok):
    with netns.VirtualCluster(2) as c:
        names = {h.netns for h in c.hosts} | {c.switch}
        server = _start_echo(c)
        out = _run_in(c, 0, ECHO_CLIENT, c.hosts[1].addr, "5")
        assert out.stdout.strip() == "ping", out.stderr
        assert server.pid in c.pids(1)  # `ip netns exec` execs: the pid is the server itself
        # The hosts are isolated from this machine's own network: no route out of the 10.77 link.
        out = _run_in(c, 0, "import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('192.0.2.77', 9))")
        assert out.returncode != 0 and "unreachable" in out.stderr.lower()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed for n in names)
    assert server.poll() is not None


def test_cleanup_runs_when_the_body_fails(netns_ok):
    with pytest.raises(RuntimeError, match="boom"):
        with netns.VirtualCluster(2) as c:
            server = _start_echo(c)
            raise RuntimeError("boom")
    assert server.wait(timeout=10) is not None
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert c.switch not in listed and c.hosts[0].netns not in listed


def test_kill_host_leaves_no_process(cluster):
    _start_echo(cluster)
    cluster.popen(1, ["sh", "-c", "sleep 300 & sleep 300 & wait"])
    assert wait_for(lambda: len(cluster.pids(1)) >= 4, 10)
    killed = cluster.kill_host(1)
    assert len(killed) >= 4
    assert cluster.pids(1) == []


def test_cut_link_makes_the_peer_unreachable_and_restore_heals(cluster):
    _start_echo(cluster)
    cluster.cut_link(1)
    out = _run_in(cluster, 0, ECHO_CLIENT, cluster.hosts[1].addr, "2")
    assert out.returncode != 0
    assert any(w in out.stderr for w in ("timed out", "unreachable", "No route"))
    cluster.restore_link(1)
    assert wait_for(lambda: _run_in(cluster, 0, ECHO_CLIENT, cluster.hosts[1].addr, "3").stdout.strip() == "ping", 20)


def test_interface_to_the_master_is_the_host_link(cluster):
    """distdoctor.world.pick_iface, run inside a host: the route to the master leaves by the host's link."""
    code = "import sys; from distdoctor.world import pick_iface; print(pick_iface(sys.argv[1]))"
    out = _run_in(cluster, 1, code, cluster.hosts[0].addr)
    assert out.stdout.strip() == netns.IFACE, out.stderr
    out = _run_in(cluster, 0, code, "127.0.0.1")
    assert out.stdout.strip() == "lo", out.stderr


def test_netem_is_detected_by_trying(netns_ok):
    reason = netns.netem_unavailable_reason()
    # Either the kernel has netem and a delay applies, or the reason says netem is missing: never a crash.
    assert reason is None or "netem" in reason
