"""When to dump: hangs (suspected, confirmed, resumed), SIGUSR1, SIGTERM, uncaught exceptions, exit.

Hangs: each tick the hang rule of hangwatch.py says whether this rank is now suspected (a call in flight past
the adaptive threshold) or confirmed (no progress for the hang timeout) to hang, or resumed; the watchdog
dumps (or, on a resume, rewrites the last dump's header) accordingly.

SIGUSR1 while the main thread is blocked inside a collective: Python runs signal handlers only on the main
thread, between bytecodes, so a plain handler would wait until the collective returns — never, in a hang.
So the watchdog thread also owns the signal wakeup fd (`signal.set_wakeup_fd`, when no one else holds it):
CPython's C-level handler writes the signal number there immediately, and the watchdog dumps from its own
thread. The Python-level handler counts the signal too (covering programs that later take the wakeup fd for
asyncio) and chains any previous handler; counting both ways, a signal is dumped once. When `distdoctor run`
left a request in the dump directory (`.request.json`: another rank detected a hang), the dump is made for
that hang episode instead of as a plain `signal: SIGUSR1` dump.

SIGTERM (torchrun's way of stopping the surviving ranks when one failed) dumps and then terminates as the
default action would (by the signal itself from the main thread, or exit status 143 from the watchdog when the
main thread is blocked); only installed where nobody handles SIGTERM and the watchdog owns the wakeup fd.
A SIGTERM that arrives while this rank is writing a dump — typically the dump of the exception that is ending
it — waits for that dump to be on disk, and an exception's dump is never replaced by the SIGTERM one.

Exceptions: sys.excepthook and threading.excepthook are chained; the dump carries the exception's traceback
as an extra stack and, in its header, the exception's type, message and where it was raised. Exit: an
atexit hook dumps when a collective is still pending (or always with dump_on_exit), unless an exception dump
already told the story; a main thread's sys.exit with a failure code (kept by a sys.exit wrapper: SystemExit
passes no excepthook) is dumped as the exception SystemExit with that exit code and where it was called; `destroy_process_group()` does the same (recorder.at_destroy).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import sys
import threading
import time

from distdoctor.recorder.dumpfile import ensure_private_dir, frames_of_traceback, thread_key, write_atomic
from distdoctor.recorder.hangwatch import HangWatch

REQUEST_FILE = ".request.json"  # written by `distdoctor run` before it sends SIGUSR1 for a hang episode
TERM_WAIT_S = 30.0  # how long the watchdog lets the main thread finish a dump before it ends the process


class Watchdog:
    def __init__(self, recorder):
        self.rec = recorder
        self.hang = HangWatch(recorder)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ident: int | None = None
        self._wakeup_r: int | None = None
        self._wakeup_w: int | None = None
        self.sig_bytes = 0  # SIGUSR1 seen on the wakeup fd
        self.sig_handled = 0  # SIGUSR1 seen by the Python handler
        self.sig_dumped = 0
        self._requests_done: set[str] = set()
        self._prev_usr1 = None
        self._term_lock = threading.Lock()
        self._terminating = False
        self._term_deferred = False  # SIGTERM came while the main thread was dumping: end once the dump landed
        self._in_excepthook = False
        self._prev_excepthook = None
        self._prev_thread_hook = None
        self._prev_exit = None
        self.exit_call: dict | None = None  # the main thread's sys.exit(code): the code and where it was called

    # ---- start / stop --------------------------------------------------------------------------------------
    def start(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._install_signal()
        self._install_excepthooks()
        atexit.register(self._at_exit)
        self.rec.after_dump = self._after_dump
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
        if sys.exit == self._sys_exit:
            sys.exit = self._prev_exit
        atexit.unregister(self._at_exit)
        self._remove_pid_file()

    def hang_header(self) -> dict | None:
        return self.hang.header()

    # ---- the thread ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        self.ident = threading.get_ident()
        cfg = self.rec.config
        limits = [x for x in (cfg.hang_timeout, cfg.suspect_floor if cfg.hang_timeout else None) if x]
        tick = min([1.0] + [x / 4 for x in limits])
        while not self._stop.is_set():
            self._wait(tick)
            if self._stop.is_set():
                break
            try:
                self._check()
            except Exception as exc:  # the watchdog must outlive any surprise
                print(f"distdoctor.recorder: watchdog error: {type(exc).__name__}: {exc}", file=sys.stderr)

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
            if bytes([signal.SIGTERM]) in data and signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                # give the main thread a moment: if it runs Python it handles this itself, the default way
                time.sleep(0.2)
                self._terminate_from_watchdog()

    def _check(self) -> None:
        rec = self.rec
        rec.poll_async()
        requested = max(self.sig_bytes, self.sig_handled)
        if requested > self.sig_dumped:
            self.sig_dumped = requested
            self._signal_dump()
        if not rec.group_alive():
            return  # the process group is gone (destroyed through a reference we did not wrap): no hang to see
        action = self.hang.tick()
        if action is not None:
            kind, reason = action
            if kind == "rewrite" and rec.rewrite_header(reason, self.hang.header()):
                return
            rec.dump(reason)

    def _signal_dump(self) -> None:
        """SIGUSR1: for the hang episode `distdoctor run` asks about, when there is a new request; else plain."""
        request = self._read_request()
        if request is None:
            self.rec.dump("signal: SIGUSR1")
            return
        self._requests_done.add(request["id"])
        hang = request.get("hang")
        if not isinstance(hang, dict) or self.hang.adopt(hang):
            self.rec.dump(str(request.get("reason") or "signal: SIGUSR1")[:500])

    def _read_request(self) -> dict | None:
        try:
            with open(os.path.join(self.rec.config.dump_dir, REQUEST_FILE)) as f:
                request = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(request, dict) or not isinstance(request.get("id"), str):
            return None
        if request["id"] in self._requests_done or self.rec.rank not in (request.get("ranks") or []):
            return None  # handled, or not addressed to this rank: this SIGUSR1 is someone else's
        return request

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
            return
        # SIGTERM (what torchrun sends the surviving ranks when one fails): dump, then die as the default action
        # would. Only where nobody handles SIGTERM yet and the watchdog owns the wakeup fd — a Python handler
        # alone would leave a rank blocked inside a collective unkillable by SIGTERM.
        try:
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            pass

    def _uninstall_signal(self) -> None:
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
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

    def _claim_termination(self) -> bool:
        with self._term_lock:
            if self._terminating:
                return False
            self._terminating = True
            return True

    def _on_sigterm(self, signum, frame) -> None:
        """Main thread, when it runs Python: dump, then terminate by the default action. When the main thread
        was itself writing a dump (this handler interrupted it), the dump is finished first (_after_dump)."""
        if self.rec.dumping_here() or self._in_excepthook:
            self._term_deferred = True
            return
        self._terminate(from_main=True)

    def _terminate(self, from_main: bool) -> None:
        if not self._claim_termination():
            return
        rec = self.rec
        if rec.final_dump_reason is None:
            rec.final_dump_reason = "signal: SIGTERM"
            rec.dump("signal: SIGTERM")  # waits for a dump another thread is writing
        else:  # an exception's dump tells the story: let it land, never replace it
            with rec._dump_lock:
                pass
        self._remove_pid_file()
        if from_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        os._exit(128 + signal.SIGTERM)

    def _terminate_from_watchdog(self) -> None:
        """The main thread is blocked (in a collective) or busy dumping: end the process from here, as SIGTERM
        would have, once a dump the main thread is writing has landed (bounded by TERM_WAIT_S)."""
        deadline = time.monotonic() + TERM_WAIT_S
        while (self._term_deferred or self.rec._dumping) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._terminate(from_main=False)

    def _after_dump(self) -> None:
        if (self._term_deferred and not self._in_excepthook
                and threading.current_thread() is threading.main_thread()):
            self._term_deferred = False
            self._terminate(from_main=True)

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
        self._prev_exit = sys.exit
        sys.exit = self._sys_exit

    def _sys_exit(self, status=None):
        """sys.exit: SystemExit passes no excepthook, so the code a rank leaves with and where it chose to are
        kept here for the exit dump (a rank that exits mid-job with code 3 is a cause, as an exception is)."""
        if threading.current_thread() is threading.main_thread():
            caller = sys._getframe(1)
            self.exit_call = {"code": status, "where": f"{caller.f_code.co_name} ({caller.f_code.co_filename}:"
                                                       f"{caller.f_lineno})"}
        self._prev_exit(status)

    def _exception_dump(self, exc_type, exc, tb, thread) -> None:
        if exc_type is None or issubclass(exc_type, SystemExit):
            return
        reason = f"exception: {exc_type.__name__}: {exc}".replace("\n", " ")[:500]
        self.rec.final_dump_reason = reason
        frames = frames_of_traceback(tb)
        name = thread.name if thread is not None else "thread"
        last = frames[-1] if frames else None
        self.rec.exception = {"type": exc_type.__name__, "message": str(exc)[:2000], "thread": name,
                              "where": str(last) if last else None, "exit_code": 1 if thread is
                              threading.main_thread() else None}
        # The thread's stack is where it raised (its live stack is only the hook by now), also under a name
        # that says so.
        extra = {f"exception in {name}": frames}
        if thread is not None:
            extra[thread_key(name, thread.ident)] = frames
        self.rec.dump(reason, extra_stacks=extra)

    def _excepthook(self, exc_type, exc, tb) -> None:
        main = threading.current_thread() is threading.main_thread()
        self._in_excepthook = main
        try:
            if self.rec.active:
                self._exception_dump(exc_type, exc, tb, threading.current_thread())
            (self._prev_excepthook or sys.__excepthook__)(exc_type, exc, tb)
        finally:
            self._in_excepthook = False
        if self._term_deferred and main:  # a SIGTERM came while the exception was being dumped
            self._term_deferred = False
            self._terminate(from_main=True)

    def _thread_excepthook(self, args) -> None:
        if self.rec.active and args.thread is not self._thread:
            self._exception_dump(args.exc_type, args.exc_value, args.exc_traceback, args.thread)
        (self._prev_thread_hook or threading.__excepthook__)(args)

    def _at_exit(self) -> None:
        rec = self.rec
        self._remove_pid_file()
        if rec.final_dump_reason is not None:
            return
        call = self.exit_call
        if call is not None and call["code"] not in (None, 0):  # a failure code: dumped as an exception is
            code = call["code"] if isinstance(call["code"], int) else 1
            reason = f"exception: SystemExit: {call['code']}"[:500]
            rec.exception = {"type": "SystemExit", "message": str(call["code"])[:2000], "thread": "MainThread",
                             "where": call["where"], "exit_code": code}
            rec.final_dump_reason = reason
            rec.dump(reason)
            return
        if rec.pending:
            rec.dump(f"exit: process exiting with {rec.pending_summary()}")
        elif rec.config.dump_on_exit:
            rec.dump("exit: normal exit")

    # ---- pid registry (lets `distdoctor run` signal every rank, not the launcher) ---------------------------
    def _pid_path(self) -> str:
        return os.path.join(self.rec.rank_dir(), f".rank_{self.rec.rank}.pid")

    def _write_pid_file(self) -> None:
        if os.environ.get("DISTDOCTOR_RUN") != "1":
            return
        try:
            ensure_private_dir(self.rec.config.dump_dir)
            ensure_private_dir(self.rec.rank_dir())
            write_atomic(self._pid_path(), f"{os.getpid()}\n{socket.gethostname()}\n".encode())
        except OSError:
            pass

    def _remove_pid_file(self) -> None:
        if os.environ.get("DISTDOCTOR_RUN") != "1" or self.rec.pid != os.getpid():
            return
        try:
            os.unlink(self._pid_path())
        except OSError:
            pass
