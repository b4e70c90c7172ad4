"""Many small HTTP requests at once, bounded in number and in time: the watcher's fan-in (diagnose/live.py).

One selector loop over non-blocking sockets, no task or future per request: at 16 384 ranks per poll the
watcher's CPU goes to the sockets, not to an event loop's bookkeeping (asyncio's streams cost about eighteen
callbacks per request). At most `concurrency` requests are in flight, at most `per_server` to one address (a
worker server accepts with a short backlog and few threads: a burst beyond them is answered only after TCP's SYN
retransmits). Each request is bounded by `timeout` from the moment it is sent; an answer larger than `max_body`
is refused, never buffered. A request never raises: it ends as (status, body, None) or (0, None, reason).
"""

from __future__ import annotations

import errno
import ipaddress
import selectors
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

Result = tuple[int, "bytes | None", "str | None"]


@dataclass
class Request:
    host: str
    port: int
    path: str
    timeout: float


@dataclass
class _Flight:
    index: int
    sock: socket.socket
    server: tuple[str, int]
    deadline: float
    out: bytes
    data: bytearray = field(default_factory=bytearray)


def fetch(requests: list[Request], concurrency: int, per_server: int, max_body: int) -> list[Result]:
    """POST each request (torch's worker server answers POST and GET); the results in the requests' order."""
    results: list[Result | None] = [None] * len(requests)
    queues: dict[tuple[str, int], deque[int]] = {}
    for i, r in enumerate(requests):
        queues.setdefault((r.host, r.port), deque()).append(i)
    busy = dict.fromkeys(queues, 0)
    ready = _Ready(queues)  # servers with requests waiting, round robin
    addrs = _resolve_all({r.host: r.port for r in requests}, max((r.timeout for r in requests), default=0.0))
    sel = selectors.DefaultSelector()
    flights: dict[int, _Flight] = {}  # fd -> request in flight
    try:
        while ready or flights:
            while ready and len(flights) < concurrency:
                server = ready.pop()
                queue = queues[server]
                if busy[server] >= per_server:
                    continue  # put back when one of its requests ends
                i = queue.popleft()
                busy[server] += 1
                if queue:
                    ready.add(server)
                flight = _open(i, requests[i], server, sel, results, addrs)
                if flight is None:
                    _done(server, busy, queues, ready)
                else:
                    flights[flight.sock.fileno()] = flight
            if not flights:
                continue
            now = time.monotonic()
            wait = max(0.0, min(f.deadline for f in flights.values()) - now)
            for key, events in sel.select(min(wait, 0.5)):
                flight = flights.get(key.fd)
                if flight is not None and _step(flight, events, sel, results, max_body):
                    del flights[key.fd]
                    _done(flight.server, busy, queues, ready)
            now = time.monotonic()
            for fd, flight in [(fd, f) for fd, f in flights.items() if f.deadline <= now]:
                req = requests[flight.index]
                _close(flight, sel, results, (0, None, f"no answer within {req.timeout:g} s"))
                del flights[fd]
                _done(flight.server, busy, queues, ready)
    finally:
        for flight in flights.values():
            _close(flight, sel, results, (0, None, "the poll ended"))
        sel.close()
    return [r if r is not None else (0, None, "not asked") for r in results]


class _Ready:
    """The servers with requests waiting and a free slot, in round-robin order (a set beside the queue)."""

    def __init__(self, servers) -> None:
        self.order = deque(servers)
        self.members = set(self.order)

    def __bool__(self) -> bool:
        return bool(self.order)

    def pop(self):
        server = self.order.popleft()
        self.members.discard(server)
        return server

    def add(self, server) -> None:
        if server not in self.members:
            self.members.add(server)
            self.order.append(server)


def _done(server, busy: dict, queues: dict, ready: _Ready) -> None:
    busy[server] -= 1
    if queues[server]:
        ready.add(server)


_RESOLVED: dict[str, tuple] = {}  # host name -> (family, address), once resolved


def _resolve_all(hosts: dict[str, int], timeout: float) -> dict[str, tuple | str]:
    """host -> (family, address) or why it does not resolve. Addresses need no resolver; names are resolved
    once per process, each on a thread of its own, all bounded by `timeout` (a resolver can take its own
    time, 30 s and more, where the network has none)."""
    out: dict[str, tuple | str] = {}
    names = []
    for host in hosts:
        try:
            ip = ipaddress.ip_address(host)
            out[host] = (socket.AF_INET6 if ip.version == 6 else socket.AF_INET, host)
        except ValueError:
            if host in _RESOLVED:
                out[host] = _RESOLVED[host]
            else:
                names.append(host)
    threads = [threading.Thread(target=_resolve, args=(h, hosts[h], out), daemon=True) for h in names]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for host in names:
        out.setdefault(host, f"the address {host!r} does not resolve within {timeout:g} s")
    return out


def _resolve(host: str, port: int, out: dict) -> None:
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        out[host] = _RESOLVED[host] = (family, sockaddr[0])
    except (OSError, UnicodeError) as exc:
        out[host] = f"the address {host!r} does not resolve ({_why(exc)})"


def _open(i: int, req: Request, server, sel, results: list, addrs: dict) -> _Flight | None:
    where = addrs[req.host]
    if isinstance(where, str):
        results[i] = (0, None, where)
        return None
    family, ip = where
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        results[i] = (0, None, _why(exc))
        return None
    sock.setblocking(False)
    code = sock.connect_ex((ip, req.port) if family != socket.AF_INET6 else (ip, req.port, 0, 0))
    if code not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK):
        sock.close()
        results[i] = (0, None, f"ConnectionError: {errno.errorcode.get(code, code)}")
        return None
    out = (f"POST {req.path} HTTP/1.1\r\nHost: {req.host}:{req.port}\r\nContent-Length: 0\r\n"
           "Connection: close\r\n\r\n").encode()
    flight = _Flight(i, sock, server, time.monotonic() + req.timeout, out)
    sel.register(sock, selectors.EVENT_WRITE)
    return flight


def _step(flight: _Flight, events: int, sel, results: list, max_body: int) -> bool:
    """Advance one request on a readiness event; True when it ended."""
    sock = flight.sock
    try:
        if events & selectors.EVENT_WRITE and flight.out:
            sent = sock.send(flight.out)  # a connect that failed fails here (ECONNREFUSED, ...)
            flight.out = flight.out[sent:]
            if not flight.out:
                sel.modify(sock, selectors.EVENT_READ)
            return False
        while True:
            try:
                chunk = sock.recv(1 << 16)
            except BlockingIOError:
                return False
            if not chunk:
                _close(flight, sel, results, _parse(bytes(flight.data)))
                return True
            flight.data += chunk
            if len(flight.data) > max_body:
                raise ValueError(f"answer larger than {max_body >> 20} MiB")
    except (OSError, ValueError) as exc:
        _close(flight, sel, results, (0, None, _why(exc)))
        return True


def _close(flight: _Flight, sel, results: list, result: Result) -> None:
    results[flight.index] = result
    try:
        sel.unregister(flight.sock)
    except (KeyError, ValueError):
        pass
    flight.sock.close()


def _why(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}"


def _parse(data: bytes) -> Result:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    first = lines[0].split()
    if len(first) < 2 or not first[1].isdigit():
        return 0, None, "ValueError: the connection closed without an HTTP answer"
    if any(ln.lower().startswith(b"transfer-encoding:") and b"chunked" in ln.lower() for ln in lines[1:]):
        try:
            body = _unchunk(body)
        except ValueError:
            return 0, None, "ValueError: a chunked answer that ends early"
    return int(first[1]), body, None


def _unchunk(body: bytes) -> bytes:
    out, i = bytearray(), 0
    while True:
        end = body.index(b"\r\n", i)
        size = int(body[i:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2:end + 2 + size]
        i = end + 2 + size + 2
