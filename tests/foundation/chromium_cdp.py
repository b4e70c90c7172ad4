"""Load a page in a real headless Chromium and report what its console said, over the DevTools protocol.

`--remote-debugging-pipe` makes Chromium read DevTools commands from fd 3 and write replies and events to fd 4
(NUL-terminated JSON messages), so no port, no websocket library. Collected: console calls
(Runtime.consoleAPICalled), uncaught exceptions (Runtime.exceptionThrown) and browser log entries
(Log.entryAdded: failed resource loads, security errors), the page's text, and a PNG screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


class _Pipe:
    def __init__(self, write_fd: int, read_fd: int, timeout: float):
        self.w, self.r, self.buf, self.next_id = write_fd, read_fd, b"", 0
        self.deadline = time.monotonic() + timeout
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str) -> dict:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        while True:
            ev = self._read()
            if ev.get("method") == method:
                return ev
            self.events.append(ev)

    def _read(self) -> dict:
        while b"\0" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError("the browser did not answer in time")
            chunk = os.read(self.r, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed the DevTools pipe")
            self.buf += chunk
        msg, _, self.buf = self.buf.partition(b"\0")
        return json.loads(msg)


def load_page(path: str, width: int = 1100, height: int = 900, timeout: float = 60) -> dict:
    """{"console": [(type, text)], "exceptions": [text], "log": [(level, source, text)], "text": str, "png": bytes}."""
    browser = find_browser()
    if browser is None:
        raise FileNotFoundError("no chromium")
    to_browser_r, to_browser_w = os.pipe()
    from_browser_r, from_browser_w = os.pipe()
    profile = tempfile.mkdtemp(prefix="distdoctor-chromium-")

    def fds():  # in the child: the browser reads fd 3 and writes fd 4
        read, write = os.dup(to_browser_r), os.dup(from_browser_w)  # never dup2(3, 3): it keeps close-on-exec
        os.dup2(read, 3)
        os.dup2(write, 4)

    proc = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                             "--no-first-run", "--disable-extensions", "--remote-debugging-pipe",
                             f"--user-data-dir={profile}", "about:blank"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            close_fds=False, preexec_fn=fds, start_new_session=True)
    os.close(to_browser_r)
    os.close(from_browser_w)
    pipe = _Pipe(to_browser_w, from_browser_r, timeout)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        pipe.send("Page.navigate", {"url": "file://" + os.path.abspath(path)}, session=session)
        pipe.wait_event("Page.loadEventFired")
        text = pipe.send("Runtime.evaluate", {"expression": "document.body.innerText", "returnByValue": True},
                         session=session)["result"].get("value", "")
        full = pipe.send("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                              "returnByValue": True}, session=session)["result"].get("value", height)
        pipe.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": int(full), "deviceScaleFactor": 1,
                                                         "mobile": False}, session=session)
        png = base64.b64decode(pipe.send("Page.captureScreenshot", {"format": "png"}, session=session)["data"])
        events = list(pipe.events)
        try:
            pipe.send("Browser.close")
        except (RuntimeError, TimeoutError):
            pass
    finally:
        os.close(to_browser_w)
        os.close(from_browser_r)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
    console, exceptions, log = [], [], []
    for ev in events:
        params = ev.get("params", {})
        if ev.get("method") == "Runtime.consoleAPICalled":
            console.append((params.get("type"), " ".join(str(a.get("value", a.get("description", "")))
                                                         for a in params.get("args", []))))
        elif ev.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            exceptions.append(details.get("exception", {}).get("description") or details.get("text", ""))
        elif ev.get("method") == "Log.entryAdded":
            entry = params.get("entry", {})
            log.append((entry.get("level"), entry.get("source"), entry.get("text")))
    return {"console": console, "exceptions": exceptions, "log": log, "text": text, "png": png}


def errors(page: dict) -> list[str]:
    """Everything that counts as a console error: console.error/assert, uncaught exceptions, error log entries."""
    out = [f"console.{kind}: {text}" for kind, text in page["console"] if kind in ("error", "assert")]
    out += [f"exception: {text}" for text in page["exceptions"]]
    out += [f"{source} {level}: {text}" for level, source, text in page["log"] if level == "error"]
    return out
