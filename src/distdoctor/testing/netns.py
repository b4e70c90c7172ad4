"""Virtual hosts on one Linux machine: network namespaces joined by a bridge, for real multi-host runs.

A `VirtualCluster` of N hosts is N network namespaces, each with its own loopback and one veth interface
(`IFACE`, address 10.77.0.(i+1)/24 by default) whose other end is a port of a Linux bridge that lives in a
separate "switch" namespace. Nothing is created in the caller's namespace, so a leaked object cannot disturb
the machine's own network, and parallel clusters cannot collide: every name carries the creating process id
and a counter. Traffic stays on these private links (and each namespace's own loopback).

Faults a real cluster suffers, on a host's link (both directions, i.e. both veth ends):
- `cut_link(host)`: the link goes down (`ip link set ... down`): peers become unreachable, TCP stalls;
- `rate_limit(host, rate)`: a token-bucket filter (`tc ... tbf`) — a slow link that every kernel offers;
- `delay(host, ms)`: `tc ... netem delay`; raises `NetemUnavailable` where the kernel has no netem;
- `kill_host(host)`: SIGKILL to every process whose network namespace is that host (a lost node).

Processes are started in a host with `popen(host, argv)` (`ip netns exec`, own session so their process
group can be killed). `close()` kills every process in every namespace of the cluster and deletes the
namespaces (which removes their veths and the bridge); it is idempotent and also runs at interpreter exit.
Needs root (CAP_SYS_ADMIN/CAP_NET_ADMIN) and iproute2; `unavailable_reason()` says why not when not.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

IFACE = "ddnet0"  # the interface name inside every virtual host
NAME_PREFIX = "ddmh"
_counter = itertools.count()


class NetemUnavailable(RuntimeError):
    """The kernel offers no netem qdisc (no sch_netem module)."""


def _ip(*args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip() or out.returncode}")
    return out


def unavailable_reason() -> str | None:
    """None when namespaces, veths and bridges can be made here; otherwise the reason why not."""
    if not shutil.which("ip"):
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); not running as root"
    probe = f"{NAME_PREFIX}{os.getpid()}probe{next(_counter)}"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"cannot create a network namespace: {made.stderr.strip()}"
        bridge = _ip("-n", probe, "link", "add", "br0", "type", "bridge", check=False)
        if bridge.returncode != 0:
            return f"cannot create a bridge in a namespace: {bridge.stderr.strip()}"
        veth = _ip("-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb", check=False)
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run ip: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


@dataclass
class Host:
    index: int
    netns: str
    addr: str
    iface: str = IFACE
    port: str = ""  # the veth end on the bridge, in the switch namespace

    @property
    def name(self) -> str:
        return f"host{self.index}"


@dataclass
class VirtualCluster:
    n_hosts: int = 2
    subnet: str = "10.77.0"  # /24; host i gets .(i+1)
    hosts: list[Host] = field(default_factory=list)
    switch: str = ""
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _closed: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.n_hosts <= 200:
            raise ValueError(f"n_hosts must be in 1..200, got {self.n_hosts}")
        tag = f"{NAME_PREFIX}{os.getpid()}x{next(_counter)}"
        self.switch = f"{tag}sw"
        self.hosts = [Host(i, f"{tag}h{i}", f"{self.subnet}.{i + 1}", port=f"p{i}") for i in range(self.n_hosts)]

    # ---- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> "VirtualCluster":
        atexit.register(self.close)
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for h in self.hosts:
                _ip("netns", "add", h.netns)
                _ip("-n", h.netns, "link", "set", "lo", "up")
                # Create the pair directly in the two namespaces: nothing ever exists in ours.
                _ip("link", "add", h.iface, "netns", h.netns, "type", "veth", "peer", "name", h.port,
                    "netns", self.switch)
                _ip("-n", self.switch, "link", "set", h.port, "master", "br0")
                _ip("-n", self.switch, "link", "set", h.port, "up")
                _ip("-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", h.iface)
                _ip("-n", h.netns, "link", "set", h.iface, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> "VirtualCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process in the cluster's namespaces and delete them. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for p in self._procs:
            _killpg(p)
        for h in self.hosts:
            self.kill_host(h)
        for ns in [h.netns for h in self.hosts] + [self.switch]:
            _ip("netns", "del", ns, check=False)
        for p in self._procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    # ---- processes --------------------------------------------------------------------------------------------

    def popen(self, host: Host | int, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start argv inside `host` in a new session (its own process group); tracked for cleanup.

        Where `unshare` exists the process also gets its own UTS namespace with the host's name as hostname,
        so reports name the virtual host ("host1"), as they would name a real node. Every step execs, so the
        returned pid is the program's own."""
        h = self._host(host)
        kwargs.setdefault("start_new_session", True)
        prefix = ["ip", "netns", "exec", h.netns]
        if shutil.which("unshare"):
            prefix += ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', h.name]
        proc = subprocess.Popen([*prefix, *argv], **kwargs)
        self._procs.append(proc)
        return proc

    def pids(self, host: Host | int) -> list[int]:
        """Every live process whose network namespace is this host's (what a node's process table holds)."""
        out = _ip("netns", "pids", self._host(host).netns, check=False)
        pids = [int(p) for p in out.stdout.split() if p.strip().isdigit()]
        return [p for p in pids if not _is_zombie(p)]

    def kill_host(self, host: Host | int, sig: int = signal.SIGKILL, settle_s: float = 10.0) -> list[int]:
        """Send `sig` to every process on the host, repeatedly until none is left (children forked meanwhile
        included) or `settle_s` passes. Returns the pids signalled."""
        h = self._host(host)
        killed: list[int] = []
        deadline = time.monotonic() + settle_s
        while True:
            pids = self.pids(h)
            if not pids or time.monotonic() > deadline:
                return killed
            for pid in pids:
                try:
                    os.kill(pid, sig)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
            if sig != signal.SIGKILL:
                return killed
            time.sleep(0.05)

    def link_bytes(self, host: Host | int) -> int:
        """Bytes sent plus received on the host's link so far (to wait until a job is really communicating)."""
        h = self._host(host)
        out = _ip("-n", h.netns, "-s", "-j", "link", "show", "dev", h.iface, check=False)
        try:
            stats = json.loads(out.stdout)[0]["stats64"]
            return int(stats["rx"]["bytes"]) + int(stats["tx"]["bytes"])
        except (ValueError, LookupError, TypeError):
            return 0

    # ---- link faults ------------------------------------------------------------------------------------------

    def cut_link(self, host: Host | int) -> None:
        h = self._host(host)
        _ip("-n", h.netns, "link", "set", h.iface, "down")
        _ip("-n", self.switch, "link", "set", h.port, "down")

    def restore_link(self, host: Host | int) -> None:
        h = self._host(host)
        _ip("-n", self.switch, "link", "set", h.port, "up")
        _ip("-n", h.netns, "link", "set", h.iface, "up")

    def rate_limit(self, host: Host | int, rate: str = "20mbit", burst: str = "64kb", latency: str = "500ms") -> None:
        """Token-bucket rate limit on both ends of the host's link (both directions slow)."""
        h = self._host(host)
        for ns, dev in ((h.netns, h.iface), (self.switch, h.port)):
            _tc(ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst, "latency", latency)

    def delay(self, host: Host | int, ms: float) -> None:
        """netem delay on both ends of the host's link; NetemUnavailable where the kernel lacks netem."""
        h = self._host(host)
        for ns, dev in ((h.netns, h.iface), (self.switch, h.port)):
            out = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "netem",
                                  "delay", f"{ms}ms"], capture_output=True, text=True, timeout=30)
            if out.returncode != 0:
                if "unknown" in out.stderr.lower() or "no such file" in out.stderr.lower():
                    raise NetemUnavailable(f"tc netem is not available in this kernel: {out.stderr.strip()}")
                raise RuntimeError(f"tc netem on {dev}: {out.stderr.strip()}")

    def clear_qdisc(self, host: Host | int) -> None:
        h = self._host(host)
        for ns, dev in ((h.netns, h.iface), (self.switch, h.port)):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, timeout=30)

    def _host(self, host: Host | int) -> Host:
        return self.hosts[host] if isinstance(host, int) else host


def netem_unavailable_reason() -> str | None:
    """None when `tc ... netem` works here (tried on a throwaway cluster), else the reason."""
    if shutil.which("tc") is None:
        return "tc (iproute2) is not installed"
    try:
        with VirtualCluster(1) as c:
            c.delay(0, 1)
    except NetemUnavailable as exc:
        return str(exc)
    except RuntimeError as exc:
        return f"tc netem failed: {exc}"
    return None


def tbf_unavailable_reason() -> str | None:
    if shutil.which("tc") is None:
        return "tc (iproute2) is not installed"
    try:
        with VirtualCluster(1) as c:
            c.rate_limit(0)
    except RuntimeError as exc:
        return f"tc tbf failed: {exc}"
    return None


def cleanup_stale() -> list[str]:
    """Delete namespaces left by clusters whose creating process is gone (e.g. a test run killed with -9)."""
    out = _ip("netns", "list", check=False)
    removed = []
    for line in out.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NAME_PREFIX):
            continue
        digits = name[len(NAME_PREFIX):].split("x", 1)[0]
        if digits.isdigit() and not _pid_alive(int(digits)):
            for pid in _ip("netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


def _tc(ns: str, *args: str) -> None:
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {out.stderr.strip()}")


def _killpg(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (OSError, IndexError):
        return True
