"""`distdoctor run`'s live evidence: on the host of global rank 0, every rank's state read through the job's store.

Rank 0 leaves the store's address in its dump directory (recorder/live.py, `.live.json`: a local file, no
shared file system needed). The `run` on that host then polls every rank in the background (diagnose/live_watch.py,
passive: it prints nothing itself). A rank anywhere that reports a hang episode opens the episode here as a local
dump would (run_watch.JobWatch), and the verdict is made from every rank's live state instead of the dumps
this host happens to see; ranks that did not answer get a line each. Without rank 0 here, or when the store
cannot be reached, `run` works from the dump files as before.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from distdoctor.recorder import layout
from distdoctor.recorder.live import PEER_FILE, RUN_FILE

LOOK_EVERY_S = 1.0
STOP_WAIT_S = 2.0  # the poller's last round: a poll times out after 1.5 s


class RunLive:
    def __init__(self, dump_dir: str, say) -> None:
        self.dump_dir, self.say = dump_dir, say
        self.watch = None
        self._thread: threading.Thread | None = None
        self.elsewhere: tuple[str, int] | None = None  # the store, when rank 0 runs on another host
        self._next_look = 0.0

    def look(self) -> None:
        """Start the background poller once rank 0 left the store's address here (cheap to call often)."""
        if self.watch is not None or time.time() < self._next_look:
            return
        self._next_look = time.time() + LOOK_EVERY_S
        if self.elsewhere is None:
            found = [_read(p) for p in layout.find(self.dump_dir, PEER_FILE)]
            self.elsewhere = next((f[:2] for f in found if f is not None), None)
        for info in map(_read, layout.find(self.dump_dir, RUN_FILE)):
            if info is None:
                continue
            addr, port, host = info
            if host != socket.gethostname():  # a shared dump directory: rank 0's own host watches
                self.elsewhere = (addr, port)
                continue
            from distdoctor.diagnose.live_watch import LiveWatch

            self.watch = LiveWatch(addr, port, self.say, None, passive=True)
            self._thread = threading.Thread(target=self.watch.run, name="distdoctor-live-watch", daemon=True)
            self._thread.start()
            self.say(f"reading every rank's state live through the job's store at {addr}:{port}")
            return

    def hang_headers(self) -> list[dict]:
        """{"rank", "hang"} of every rank whose last answer carries a hang episode (as its dump header would)."""
        watch = self.watch
        if watch is None:
            return []
        return [{"rank": r, "hang": a.state["hang"]} for r, a in sorted(dict(watch.answers).items())
                if a.state is not None and isinstance(a.state.get("hang"), dict)]

    def evidence(self):
        """(diagnose's report over every rank's live state, lines on the ranks that did not answer), or None: also
        when fewer ranks answered than left their dump files in this directory (the dump files' verdict then)."""
        watch = self.watch
        if watch is None or watch.job is None:
            return None
        got = watch.evidence()
        if got is not None and len(got[0].traces.ranks) < len(layout.find(self.dump_dir, "rank_*.jsonl")):
            return None  # fewer ranks answered than left dumps here (they ended since): the dumps say more
        return got

    def pointer(self) -> str | None:
        """Where the verdict over every rank is printed, when it is not here."""
        if self.watch is not None or self.elsewhere is None:
            return None
        addr, port = self.elsewhere
        return (f"the verdict over every rank is printed by distdoctor run on the host of rank 0 (or: distdoctor "
                f"watch --master-addr {addr} --master-port {port}); the dumps here are this host's ranks'.")

    def stop(self) -> bool:
        """Stop the poller and wait for it (bounded); returns False when it is still busy: then inside torch's
        store client (a connection to a store that is gone takes 5 s), and an interpreter that finalizes while a
        daemon thread is in that C++ code aborts ("terminate called without an active exception", SIGABRT)."""
        if self.watch is not None:
            self.watch.stop_event.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)
            return not self._thread.is_alive()
        return True

    def clean_up(self) -> None:
        for path in layout.find(self.dump_dir, RUN_FILE) + layout.find(self.dump_dir, PEER_FILE):
            try:
                os.unlink(path)
            except OSError:
                pass


def _read(path: str) -> tuple[str, int, str] | None:
    try:
        with open(path) as f:
            info = json.load(f)
        return str(info["master_addr"]), int(info["master_port"]), str(info.get("host") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return None
