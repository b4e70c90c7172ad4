"""When to dump: hang watchdog, SIGUSR1, uncaught exceptions, exit with a collective pending.

Hang rule: dump once when no collective has completed for `hang_timeout` seconds since the last collective
was issued or completed (or since the process group came up). This fires both on a rank blocked inside a
collective and on a rank that never reaches the next one (stuck in its data loader while the others wait),
which is the rank the operator most needs to see. It re-arms when a collective completes.

SIGUSR1 while the main thread is blocked inside a collective: Python runs signal handlers only on the main
thread, between bytecodes, so a plain handler would wait until the collective returns — never, in a hang.
So the watchdog thread also owns the signal wakeup fd (`signal.set_wakeup_fd`, when no one else holds it):
CPython's C-level handler writes the signal number there immediately, and the watchdog dumps from its own
thread. The Python-level handler counts the signal too (covering programs that later take the wakeup fd for
asyncio) and chains any previous handler; counting both ways, a signal is dumped once.

Exceptions: sys.excepthook and threading.excepthook are chained; the dump carries the exception's traceback
as an extra stack. Exit: an atexit hook dumps when a collective is still pending (or always with
dump_on_exit), unless an exception dump already told the story.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import sys
import threading
import time

from distdoctor.trace.dumpfile import ensure_private_dir, frames_of_traceback, thread_key, write_atomic


class Watchdog:
    def __init__(self, recorder):
        self.rec = recorder
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ident: int | None = None
        self._wakeup_r: int | None = None
        self._wakeup_w: int | None = None
        self.sig_bytes = 0  # SIGUSR1 seen on the wakeup fd
        self.sig_handled = 0  # SIGUSR1 seen by the Python handler
        self.sig_dumped = 0
        self._prev_usr1 = None
        self._prev_excepthook = None
        self._prev_thread_hook = None

    # ---- start / stop --------------------------------------------------------------------------------------
    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._install_signal()
        self._install_excepthooks()
        atexit.register(self._at_exit)
        self._write_pid_file()
        self._thread = threading.Thread(target=self._run, name="distdoctor-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._wakeup_w is not None:  # wake the select() at once instead of waiting out its tick
            try:
                os.write(self._wakeup_w, b"\0")
            except OSError:
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if threading.current_thread() is threading.main_thread():
            self._uninstall_signal()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._prev_excepthook
        if threading.excepthook == self._thread_excepthook:
            threading.excepthook = self._prev_thread_hook
        atexit.unregister(self._at_exit)
        self._remove_pid_file()

    # ---- the thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        self.ident = threading.get_ident()
        timeout = self.rec.config.hang_timeout
        tick = min(1.0, timeout / 4) if timeout else 1.0
        while not self._stop.is_set():
            self._wait(tick)
            if self._stop.is_set():
                break
            try:
                self._check()
            except Exception as exc:  # the watchdog must outlive any surprise
                print(f"distdoctor.trace: watchdog error: {type(exc).__name__}: {exc}", file=sys.stderr)

    def _wait(self, tick: float) -> None:
        if self._wakeup_r is None:
            self._stop.wait(tick)
            return
        ready, _, _ = select.select([self._wakeup_r], [], [], tick)
        if ready:
            try:
                data = os.read(self._wakeup_r, 512)
            except (BlockingIOError, InterruptedError):
                return
            self.sig_bytes += data.count(bytes([signal.SIGUSR1]))

    def _check(self) -> None:
        rec = self.rec
        rec.poll_async()
        requested = max(self.sig_bytes, self.sig_handled)
        if requested > self.sig_dumped:
            self.sig_dumped = requested
            rec.dump("signal: SIGUSR1")
        timeout = rec.config.hang_timeout
        if timeout and not rec.hang_dumped:
            idle = time.time() - rec.last_progress
            if idle > timeout:
                rec.hang_dumped = True
                rec.dump(f"hang: no collective completed for {idle:.1f} s "
                         f"(hang timeout {timeout:g} s; {_pending_summary(rec)})")

    # ---- signals -------------------------------------------------------------------------------------------
    def _install_signal(self) -> None:
        try:
            self._prev_usr1 = signal.signal(signal.SIGUSR1, self._on_sigusr1)
        except (ValueError, OSError):
            return
        try:
            r, w = os.pipe()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            if previous != -1:  # the program owns the wakeup fd; leave it and rely on the handler
                signal.set_wakeup_fd(previous)
                os.close(r)
                os.close(w)
                return
            self._wakeup_r, self._wakeup_w = r, w
        except (ValueError, OSError):
            pass

    def _uninstall_signal(self) -> None:
        try:
            if signal.getsignal(signal.SIGUSR1) == self._on_sigusr1:
                signal.signal(signal.SIGUSR1, self._prev_usr1 if self._prev_usr1 is not None else signal.SIG_DFL)
            if self._wakeup_w is not None:
                current = signal.set_wakeup_fd(-1)
                if current != self._wakeup_w:
                    signal.set_wakeup_fd(current)
                os.close(self._wakeup_r)
                os.close(self._wakeup_w)
                self._wakeup_r = self._wakeup_w = None
        except (ValueError, OSError):
            pass

    def _on_sigusr1(self, signum, frame) -> None:
        self.sig_handled += 1
        prev = self._prev_usr1
        if callable(prev):
            prev(signum, frame)

    # ---- exceptions and exit -------------------------------------------------------------------------------
    def _install_excepthooks(self) -> None:
        self._prev_excepthook = sys.excepthook
        sys.excepthook = self._excepthook
        self._prev_thread_hook = threading.excepthook
        threading.excepthook = self._thread_excepthook

    def _exception_dump(self, exc_type, exc, tb, thread) -> None:
        if exc_type is None or issubclass(exc_type, SystemExit):
            return
        reason = f"exception: {exc_type.__name__}: {exc}".replace("\n", " ")[:500]
        self.rec.final_dump_reason = reason
        frames = frames_of_traceback(tb)
        name = thread.name if thread is not None else "thread"
        # The thread's stack is where it raised (its live stack is only the hook by now), also under a name
        # that says so.
        extra = {f"exception in {name}": frames}
        if thread is not None:
            extra[thread_key(name, thread.ident)] = frames
        self.rec.dump(reason, extra_stacks=extra)

    def _excepthook(self, exc_type, exc, tb) -> None:
        if self.rec.active:
            self._exception_dump(exc_type, exc, tb, threading.current_thread())
        (self._prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)

    def _thread_excepthook(self, args) -> None:
        if self.rec.active and args.thread is not self._thread:
            self._exception_dump(args.exc_type, args.exc_value, args.exc_traceback, args.thread)
        (self._prev_thread_hook or threading.__excepthook__)(args)

    def _at_exit(self) -> None:
        rec = self.rec
        if rec.final_dump_reason is not None:
            return
        if rec.pending:
            rec.dump(f"exit: process exiting with {_pending_summary(rec)}")
        elif rec.config.dump_on_exit:
            rec.dump("exit: normal exit")

    # ---- pid registry (lets `distdoctor run` signal every rank, not the launcher) ---------------------------
    def _pid_path(self) -> str:
        return os.path.join(self.rec.config.dump_dir, f".rank_{self.rec.rank}.pid")

    def _write_pid_file(self) -> None:
        if os.environ.get("DISTDOCTOR_RUN") != "1":
            return
        try:
            ensure_private_dir(self.rec.config.dump_dir)
            write_atomic(self._pid_path(), f"{os.getpid()}\n".encode())
        except OSError:
            pass

    def _remove_pid_file(self) -> None:
        try:
            os.unlink(self._pid_path())
        except OSError:
            pass


def _pending_summary(rec) -> str:
    pending = sorted(list(rec.pending), key=lambda r: r.index)
    if not pending:
        return "no collective pending"
    first = pending[0]
    where = f"seq {first.seq}" if first.seq is not None else f"peer {first.peer}"
    return f"{len(pending)} pending, oldest {first.op} on group {first.group} {where}"
