"""`distdoctor run [OPTIONS] -- CMD...`: run a job with the recorder on, and say what is wrong while it runs.

No code change: the command runs with DISTDOCTOR_TRACE=1 and a directory holding our `sitecustomize.py` first
on PYTHONPATH, so every Python process it starts (torchrun's agent, each worker, `python train.py`) enables
the recorder at start-up; it only comes alive in processes that create a process group. TORCH_FR_BUFFER_SIZE
is set too, so Flight Recorder records from the first collective. The child stays in our process group (a
terminal's Ctrl-C reaches it directly, so SIGINT is not forwarded twice, but a SIGINT from anywhere else, as
`kill -INT` to run alone, is); SIGTERM, SIGHUP and SIGQUIT are forwarded; SIGUSR1 goes to every rank that
registered its pid in the dump directory, which then dumps (never to the launcher, whose default SIGUSR1 action
would kill it). The exit code is the command's (128+N when a signal N ended it). The command's stderr passes
through run (console.py), which keeps the launcher's account of how each rank ended: when the job failed, it is
written beside the dumps, where the closing verdict reads it.

While it runs, run_watch.JobWatch turns a rank's hang dump into a dump of every rank and a verdict. Verdicts
(suspected / confirmed / resumed, and the report at the end) go to stdout; what `run` itself does (dumps
written, signals sent, the next command to try) goes to stderr.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import click

from distdoctor.errors import InputError
from distdoctor.options import Number, count, seconds
from distdoctor.recorder import layout
from distdoctor.recorder.console import ConsoleTee, save_launcher_log
from distdoctor.recorder.config import (DEFAULT_BUFFER, DEFAULT_HANG_TIMEOUT, DEFAULT_START_TIMEOUT,
                                       DEFAULT_SUSPECT_FACTOR, DEFAULT_SUSPECT_FLOOR, INJECT_ENV)
from distdoctor.recorder.dumpfile import ensure_private_dir, write_atomic
from distdoctor.recorder.run_watch import KILL_GRACE_S, POLL_S, JobWatch, read_header, remove_leftovers, signal_ranks

HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hook")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
MAX_BUFFER = 1_000_000  # calls kept per rank: beyond this the ring (and torch's own) no longer fits a host


def _say(message: str) -> None:
    click.echo(f"distdoctor run: {message}", err=True)


def _shout(message: str, nl: bool = True) -> None:
    click.echo(message, nl=nl)  # stdout: verdicts
    click.get_text_stream("stdout").flush()


def child_env(dump_dir: str, hang_timeout: float, buffer: int, stacks: bool, dump_on_exit: bool,
              suspect_floor: float = DEFAULT_SUSPECT_FLOOR, suspect_factor: float = DEFAULT_SUSPECT_FACTOR,
              start_timeout: float = DEFAULT_START_TIMEOUT) -> dict:
    env = dict(os.environ)
    env.update({
        "DISTDOCTOR_TRACE": "1",
        "DISTDOCTOR_RUN": "1",
        "DISTDOCTOR_DUMP_DIR": dump_dir,
        "DISTDOCTOR_HANG_TIMEOUT": repr(float(hang_timeout)),
        "DISTDOCTOR_SUSPECT_FLOOR": repr(float(suspect_floor)),
        "DISTDOCTOR_SUSPECT_FACTOR": repr(float(suspect_factor)),
        "DISTDOCTOR_START_TIMEOUT": repr(float(start_timeout)),
        "DISTDOCTOR_BUFFER": str(buffer),
        "DISTDOCTOR_STACKS": "1" if stacks else "0",
        "DISTDOCTOR_DUMP_ON_EXIT": "1" if dump_on_exit else "0",
        "DISTDOCTOR_HOOK_SRC": PACKAGE_PARENT,
    })
    env.setdefault("TORCH_FR_BUFFER_SIZE", str(buffer))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HOOK_DIR, os.environ.get("PYTHONPATH", "")) if p)
    return env


def summarize_dumps(dump_dir: str) -> list[tuple[int, str]]:
    """(rank, dump_reason) for each rank_<r>.jsonl in dump_dir (either layout), by rank (from the header line
    alone)."""
    found = []
    for path in layout.find(dump_dir, "rank_*.jsonl"):
        header = read_header(path)
        if header is None:
            found.append((-1, f"{os.path.basename(path)} unreadable"))
        else:
            found.append((header["rank"], str(header.get("dump_reason") or "?")))
    return sorted(found)


def prepare_dump_dir(dump_dir: str) -> bool:
    """Make sure the ranks can write their dumps here before the job starts; returns whether we created it.
    Refused (one line, exit 2) otherwise: a hang found later must not end in dumps that cannot be written."""
    created = not os.path.exists(dump_dir)
    try:
        ensure_private_dir(dump_dir)
        probe = os.path.join(dump_dir, f".probe-{os.getpid()}")
        write_atomic(probe, b"")
        os.unlink(probe)
    except OSError as exc:
        raise InputError("--dump-dir", f"{dump_dir} cannot be written ({exc.strerror or exc})") from None
    return created


def _terminal_interrupt() -> bool:
    """Whether a SIGINT most likely came from the terminal's Ctrl-C: then it reached the whole foreground process
    group, the child included, and is not sent twice. `kill -INT` to run alone (in the background, without a
    terminal, from a script) reaches only run, which forwards it."""
    for stream in (0, 1, 2):
        try:
            if os.isatty(stream):
                return os.tcgetpgrp(stream) == os.getpgrp()
        except OSError:
            continue
    return False


def _preload_analyzer() -> None:
    """Import the analyzer in the background while the job starts: a verdict later is a second sooner."""
    try:
        import distdoctor.diagnose.analyze  # noqa: F401
        import distdoctor.report.diagnose_text  # noqa: F401
        import distdoctor.trace.loaders  # noqa: F401
    except Exception:
        pass


# run's own options end at `--` or at the command's first word (no interspersed options): an unknown option
# before them is run's error (`--bogus: no such option`), never taken for the command to run.
@click.command("run", context_settings={"allow_interspersed_args": False})
@click.option("--dump-dir", type=click.Path(file_okay=False), default=None,
              help="Where each rank writes rank_<r>.jsonl (and rank_<r>.fr.pkl). "
                   "Default: ./distdoctor-dumps/<UTC time>.")
@click.option("--hang-timeout", type=seconds(), default=DEFAULT_HANG_TIMEOUT, show_default=True,
              help="A hang is confirmed when no collective progressed for this many seconds (0: no hang "
                   "detection at all).")
@click.option("--start-timeout", type=seconds(), default=DEFAULT_START_TIMEOUT, show_default=True,
              help="Start-up is not a hang: until every rank has issued its first collective (one may still be "
                   "importing torch or building the model), a wait is not suspected, and is confirmed only after "
                   "max(this, --hang-timeout), reported as a hang during start-up. 0: start-up is held to --hang-timeout like any other wait.")
@click.option("--suspect-floor", type=seconds(), default=DEFAULT_SUSPECT_FLOOR, show_default=True,
              help="A hang is suspected (every rank dumps, the verdict is printed, the job keeps running) when a "
                   "collective is in flight longer than max(this, --suspect-factor x the longest recent "
                   "collective wait). 0: only confirmed hangs.")
@click.option("--suspect-factor", type=Number("x", 0, 1e6), default=DEFAULT_SUSPECT_FACTOR, show_default=True,
              help="See --suspect-floor.")
@click.option("--kill-on-hang", is_flag=True,
              help="Stop the job (SIGTERM, then SIGKILL after --kill-grace) once a hang is confirmed.")
@click.option("--kill-grace", type=seconds(low=0, high=3600, low_open=True), default=KILL_GRACE_S,
              show_default=True, help="With --kill-on-hang: seconds from the SIGTERM to the SIGKILL of a command "
                                      "(and its ranks) still up.")
@click.option("--buffer", type=count("calls", 1, MAX_BUFFER), default=DEFAULT_BUFFER, show_default=True,
              help="Calls kept per rank (ring buffer); also Flight Recorder's TORCH_FR_BUFFER_SIZE.")
@click.option("--no-stacks", is_flag=True, help="Leave the Python stacks of all threads out of dumps.")
@click.option("--dump-on-exit", is_flag=True, help="Also dump at a clean exit (for straggler analysis).")
@click.option("--dump-layout", type=click.Choice(layout.LAYOUTS), default="flat", show_default=True,
              help="flat: every rank's files in --dump-dir; host: one subdirectory per host (host-<name>/), for "
                   f"large jobs on shared file systems; auto: host from {layout.AUTO_HOST_RANKS} ranks up.")
@click.option("--inject", "inject_specs", multiple=True, metavar="KIND:RANK[:ARG][@WHEN]",
              help="A drill: plant a fault at the torch.distributed boundary (repeatable), e.g. hang:1@step=3, "
                   "kill:2:SIGTERM@call=40, skip:0@call=7,group=1. What each rank did is written to "
                   "DUMP_DIR/.injected.json. Kinds and WHEN: docs/recorder.md, \"Drills\".")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_command(dump_dir, hang_timeout, start_timeout, suspect_floor, suspect_factor, kill_on_hang, kill_grace, buffer, no_stacks,
                dump_on_exit, dump_layout, inject_specs, command) -> int:
    """Run COMMAND (after --) with the distdoctor recorder on in every process that uses torch.distributed.

    \b
    distdoctor run -- torchrun --nproc-per-node 4 train.py
    distdoctor run --hang-timeout 120 --kill-on-hang -- python train.py
    """
    if not command:
        raise InputError("command", "nothing to run; usage: distdoctor run [OPTIONS] -- CMD [ARGS]...")
    for name, value in (("--hang-timeout", hang_timeout), ("--start-timeout", start_timeout),
                        ("--suspect-floor", suspect_floor),
                        ("--suspect-factor", suspect_factor)):
        if value < 0:
            raise InputError(name, f"must be >= 0, got {value:g}")
    if buffer < 1:
        raise InputError("--buffer", f"must be at least 1 call, got {buffer}")
    from distdoctor.world.faults import RUN_KINDS, parse_faults

    faults = parse_faults(inject_specs, RUN_KINDS)  # a bad spec: one line, exit 2, before anything starts
    if shutil.which(command[0]) is None:
        raise InputError(command[0], "command not found")
    if dump_dir is None:
        dump_dir = os.path.join("distdoctor-dumps", time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    dump_dir = os.path.abspath(dump_dir)
    if layout.find(dump_dir, "rank_*.jsonl"):
        _say(f"warning: {dump_dir} already holds dumps; new ones replace them rank by rank "
             "(use a fresh --dump-dir to keep runs apart)")
    created = prepare_dump_dir(dump_dir)
    remove_leftovers(dump_dir)  # an earlier run here that was SIGKILLed left its ranks' pid files and request

    env = child_env(dump_dir, hang_timeout, buffer, not no_stacks, dump_on_exit, suspect_floor, suspect_factor,
                    start_timeout)
    env["DISTDOCTOR_DUMP_LAYOUT"] = dump_layout
    if faults:
        env[INJECT_ENV] = json.dumps([str(f) for f in faults])
    try:
        child = subprocess.Popen(list(command), env=env, stderr=subprocess.PIPE)
    except OSError as exc:
        if created:
            os.rmdir(dump_dir)
        raise InputError(command[0], f"cannot start it ({exc.strerror or exc})") from None
    console = ConsoleTee(os.dup(child.stderr.fileno()))  # every byte on to our stderr; the launcher's account kept
    child.stderr.close()
    threading.Thread(target=_preload_analyzer, daemon=True).start()
    watch = JobWatch(dump_dir, child, kill_on_hang, _say, _shout, kill_grace)

    def forward(signum, _frame):
        if signum == signal.SIGUSR1:
            pids = signal_ranks(dump_dir)
            _say(f"SIGUSR1 sent to {len(pids)} rank(s)" if pids else "no rank has a process group yet")
        elif signum != signal.SIGINT or not _terminal_interrupt():
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    previous = {s: signal.signal(s, forward) for s in (*FORWARDED, signal.SIGINT, signal.SIGUSR1)}
    try:
        while child.poll() is None:
            try:
                watch.poll()
            except Exception as exc:  # watching must never take the job down
                _say(f"warning: watching the dumps failed ({type(exc).__name__}: {exc})")
            time.sleep(POLL_S)
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    poller_done = watch.live.stop()
    if rc < 0:
        rc = 128 - rc
    watch.stop_orphans()
    kept = console.finish()
    log = save_launcher_log(kept, dump_dir) if rc != 0 else None  # the closing verdict reads it beside the dumps

    dumps = summarize_dumps(dump_dir)
    if dumps:
        _say(f"{len(dumps)} rank dump(s) in {dump_dir}")
        for rank, reason in dumps:
            _say(f"  rank {rank}: {reason}")
    watch.closing_report(rc)
    if log:
        _say(f"the launcher's log (how each rank ended): {log}")
    if dumps:
        _say(f"next: distdoctor diagnose {dump_dir}")
    else:
        _say(f"no dumps written (no hang, no uncaught exception, nothing pending at exit); dump dir {dump_dir}")
    if faults:
        from distdoctor.recorder import inject

        truth = inject.gather_truth(dump_dir, [str(f) for f in faults])
        fired = ", ".join(f"{r['fault']} ({r.get('call', {}).get('op') or r['where']})" for r in truth["fired"])
        _say(f"injected: {fired or 'nothing (no fault found its moment)'}; the record: "
             f"{os.path.join(dump_dir, inject.TRUTH_FILE)}")
    watch.clean_up(created)
    if rc != 0:
        _say(f"command exited with code {rc}")
    if not poller_done:  # end now, with the command's code, rather than abort in the interpreter's finalization
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(rc)
    return rc
