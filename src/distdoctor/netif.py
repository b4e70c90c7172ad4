"""Which network interface reaches an address: the one Gloo must use to talk to the other hosts.

Gloo picks its interface from the host name by default; on a multi-homed node (or a container, or a network
namespace) that name often resolves to an address on the wrong network, or to one the host does not have, and
the job hangs in rendezvous. The right interface is the one the kernel routes MASTER_ADDR through: we ask the
kernel with a connected UDP socket (connect() on UDP only selects a route and a source address; it sends no
packet), then find the interface that holds that source address (IPv4 via SIOCGIFADDR, IPv6 via
/proc/net/if_inet6). Linux only for the interface lookup; elsewhere `iface_for` returns None and Gloo keeps
its own choice.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from dataclasses import dataclass

SIOCGIFADDR = 0x8915


@dataclass(frozen=True)
class IfaceChoice:
    name: str  # interface name, e.g. "eth0" — what GLOO_SOCKET_IFNAME takes
    address: str  # this host's address on it
    target: str  # the address it was chosen to reach
    how: str  # "route to <addr>" or "given"

    def describe(self) -> str:
        return f"{self.name} ({self.address}), {self.how}"


def resolve(host: str) -> str:
    """The first address `host` resolves to; ValueError naming the host when it does not."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {host!r}: {exc.strerror}") from None
    # Prefer IPv4, as torch's own store does by default.
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return infos[0][4][0]


def route_source(addr: str) -> str:
    """The local source address the kernel uses to reach `addr` (an IP literal)."""
    family = socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((addr, 9))  # discard port; UDP connect sends nothing
        return s.getsockname()[0]


def interface_addresses() -> dict[str, list[str]]:
    """Interface name -> its addresses (primary IPv4 and all IPv6), for the interfaces that are configured."""
    out: dict[str, list[str]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                out.setdefault(name, []).append(socket.inet_ntoa(packed[20:24]))
            except OSError:  # no IPv4 address on this interface
                out.setdefault(name, [])
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    addr = str(ipaddress.IPv6Address(bytes.fromhex(parts[0])))
                    out.setdefault(parts[5], []).append(addr)
    except OSError:
        pass
    return out


def iface_for(target: str) -> IfaceChoice | None:
    """The interface the kernel routes `target` (a host name or address) through, or None when unknown.

    Raises ValueError (with the reason) when the target does not resolve or no route leads to it.
    """
    addr = resolve(target)
    try:
        source = route_source(addr)
    except OSError as exc:
        raise ValueError(f"no route to {target} ({addr}): {exc.strerror or exc}") from None
    src_ip = ipaddress.ip_address(source.split("%", 1)[0])
    if src_ip.is_loopback or ipaddress.ip_address(addr).is_loopback:
        lo = next((n for n, addrs in interface_addresses().items() if any(
            ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addrs)), "lo")
        return IfaceChoice(lo, source, target, f"route to {addr}")
    for name, addrs in interface_addresses().items():
        if any(ipaddress.ip_address(a.split("%", 1)[0]) == src_ip for a in addrs):
            return IfaceChoice(name, source, target, f"route to {addr}")
    return None


def check_iface(name: str) -> IfaceChoice:
    """Validate a user-given interface name; ValueError listing the interfaces that exist when it does not."""
    addrs = interface_addresses()
    if name not in addrs:
        raise ValueError(f"no interface {name!r} on this host (have: {', '.join(sorted(addrs)) or 'none'})")
    if not addrs[name]:
        raise ValueError(f"interface {name!r} has no address")
    return IfaceChoice(name, addrs[name][0], "", "given")
