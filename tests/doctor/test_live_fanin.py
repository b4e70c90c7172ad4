"""The watcher's fan-in (diagnose/fanin.py) against real HTTP servers: answers in order, a silent server bounded
by the timeout, a refused connection, an oversized answer refused, chunked answers joined, the bounds kept."""

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from distdoctor.diagnose import fanin


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    in_flight = 0
    most = 0
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 (http.server's name)
        with self.lock:
            type(self).in_flight += 1
            type(self).most = max(type(self).most, type(self).in_flight)
        try:
            if self.path.startswith("/slow"):
                time.sleep(10)
            if self.path.startswith("/chunked"):
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for part in (b"hello ", b"world"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\n\r\n")
                return
            body = b"x" * 5000 if self.path.startswith("/big") else self.path.encode()
            time.sleep(0.02)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except BrokenPipeError:  # the watcher stopped waiting (the slow answer): as a worker server sees it
            pass
        finally:
            with self.lock:
                type(self).in_flight -= 1

    def log_message(self, *args):
        pass


def _server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_answers_in_order_and_failures_named():
    server = _server()
    port = server.server_address[1]
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    try:
        reqs = [fanin.Request("127.0.0.1", port, f"/r{i}", 5.0) for i in range(40)]
        reqs += [fanin.Request("127.0.0.1", port, "/slow", 0.5), fanin.Request("127.0.0.1", closed, "/x", 2.0),
                 fanin.Request("127.0.0.1", port, "/big", 5.0), fanin.Request("127.0.0.1", port, "/chunked", 5.0),
                 fanin.Request("no-such-host.invalid", 80, "/x", 2.0)]
        t0 = time.monotonic()
        got = fanin.fetch(reqs, concurrency=16, per_server=3, max_body=4096)
        assert time.monotonic() - t0 < 8  # the slow one (10 s) was not waited for
        assert [g[:2] for g in got[:40]] == [(200, f"/r{i}".encode()) for i in range(40)]
        assert got[40] == (0, None, "no answer within 0.5 s")
        assert got[41][0] == 0 and "ConnectionRefusedError" in got[41][2]
        assert got[42][0] == 0 and "larger than" in got[42][2]
        assert got[43][:2] == (200, b"hello world")
        assert got[44][0] == 0 and "does not resolve" in got[44][2]
        assert _Handler.most <= 3  # at most per_server to one server
    finally:
        server.shutdown()
