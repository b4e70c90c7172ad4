"""`distdoctor run [--dump-dir DIR] [--hang-timeout S] [--buffer N] -- CMD...`: run a job with the recorder on.

No code change: the command runs with DISTDOCTOR_TRACE=1 and a directory holding our `sitecustomize.py` first
on PYTHONPATH, so every Python process it starts (torchrun's agent, each worker, `python train.py`) enables
the recorder at start-up; it only comes alive in processes that create a process group. TORCH_FR_BUFFER_SIZE
is set too, so Flight Recorder records from the first collective. The child stays in our process group (a
terminal's Ctrl-C reaches it directly, so SIGINT is not forwarded twice); SIGTERM, SIGHUP and SIGQUIT are
forwarded; SIGUSR1 goes to every rank that registered its pid in the dump directory, which then dumps (never
to the launcher, whose default SIGUSR1 action would kill it). The exit code is the command's (128+N when a
signal N ended it). Afterwards it says where the dumps are, prints `distdoctor diagnose`'s text report of them
(on stderr, like everything `run` itself says) and the line to run diagnose again for other forms.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import time

import click

from distdoctor.errors import InputError
from distdoctor.trace.recorder import DEFAULT_BUFFER, DEFAULT_HANG_TIMEOUT

HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hook")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def _say(message: str) -> None:
    click.echo(f"distdoctor run: {message}", err=True)


def child_env(dump_dir: str, hang_timeout: float, buffer: int, stacks: bool, dump_on_exit: bool) -> dict:
    env = dict(os.environ)
    env.update({
        "DISTDOCTOR_TRACE": "1",
        "DISTDOCTOR_RUN": "1",
        "DISTDOCTOR_DUMP_DIR": dump_dir,
        "DISTDOCTOR_HANG_TIMEOUT": repr(float(hang_timeout)),
        "DISTDOCTOR_BUFFER": str(buffer),
        "DISTDOCTOR_STACKS": "1" if stacks else "0",
        "DISTDOCTOR_DUMP_ON_EXIT": "1" if dump_on_exit else "0",
        "DISTDOCTOR_HOOK_SRC": PACKAGE_PARENT,
    })
    env.setdefault("TORCH_FR_BUFFER_SIZE", str(buffer))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HOOK_DIR, os.environ.get("PYTHONPATH", "")) if p)
    return env


def signal_ranks(dump_dir: str, signum: int = signal.SIGUSR1) -> list[int]:
    """Send `signum` to every live rank registered in dump_dir; returns the pids signalled."""
    sent = []
    for path in glob.glob(os.path.join(dump_dir, ".rank_*.pid")):
        try:
            with open(path) as f:
                pid = int(f.read().strip())
            os.kill(pid, signum)
            sent.append(pid)
        except (OSError, ValueError):
            continue
    return sent


def summarize_dumps(dump_dir: str) -> list[tuple[int, str]]:
    """(rank, dump_reason) for each rank_<r>.jsonl in dump_dir, by rank."""
    from distdoctor.trace.model import loads

    found = []
    for path in glob.glob(os.path.join(dump_dir, "rank_*.jsonl")):
        try:
            with open(path) as f:
                trace = loads(f.read(), path)
            found.append((trace.rank, trace.dump_reason or "?"))
        except (OSError, ValueError) as exc:
            found.append((-1, f"{os.path.basename(path)} unreadable: {exc}"))
    return sorted(found)


def _auto_diagnose(dump_dir: str) -> None:
    """Print diagnose's text report for the dumps (stderr), when the analyzer is part of this build."""
    try:
        from distdoctor.diagnose.analyze import analyze
        from distdoctor.report.diagnose_text import render_text
        from distdoctor.trace.loaders import load_traces
    except ImportError:
        return
    try:
        traces = load_traces([dump_dir])
        if traces.ranks:
            click.echo("", err=True)
            click.echo(render_text(analyze(traces)), err=True, nl=False)
            click.echo("", err=True)
    except Exception as exc:  # the job's exit code and the dumps matter more than this summary
        _say(f"warning: could not analyze the dumps ({type(exc).__name__}: {exc})")


@click.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--dump-dir", type=click.Path(file_okay=False), default=None,
              help="Where each rank writes rank_<r>.jsonl (and rank_<r>.fr.pkl). "
                   "Default: ./distdoctor-dumps/<UTC time>.")
@click.option("--hang-timeout", type=float, default=DEFAULT_HANG_TIMEOUT, show_default=True,
              help="Dump when no collective completed for this many seconds (0: never).")
@click.option("--buffer", type=int, default=DEFAULT_BUFFER, show_default=True,
              help="Calls kept per rank (ring buffer); also Flight Recorder's TORCH_FR_BUFFER_SIZE.")
@click.option("--no-stacks", is_flag=True, help="Leave the Python stacks of all threads out of dumps.")
@click.option("--dump-on-exit", is_flag=True, help="Also dump at a clean exit (for straggler analysis).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run_command(dump_dir, hang_timeout, buffer, no_stacks, dump_on_exit, command) -> int:
    """Run COMMAND (after --) with the distdoctor recorder on in every process that uses torch.distributed.

    \b
    distdoctor run -- torchrun --nproc-per-node 4 train.py
    distdoctor run --hang-timeout 120 -- python train.py
    """
    if not command:
        raise InputError("command", "nothing to run; usage: distdoctor run [OPTIONS] -- CMD [ARGS]...")
    if hang_timeout < 0:
        raise InputError("--hang-timeout", f"must be >= 0 seconds, got {hang_timeout:g}")
    if buffer < 1:
        raise InputError("--buffer", f"must be at least 1 call, got {buffer}")
    if shutil.which(command[0]) is None:
        raise InputError(command[0], "command not found")
    if dump_dir is None:
        dump_dir = os.path.join("distdoctor-dumps", time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    dump_dir = os.path.abspath(dump_dir)
    if glob.glob(os.path.join(dump_dir, "rank_*.jsonl")):
        _say(f"warning: {dump_dir} already holds dumps; new ones replace them rank by rank "
             "(use a fresh --dump-dir to keep runs apart)")

    env = child_env(dump_dir, hang_timeout, buffer, not no_stacks, dump_on_exit)
    try:
        child = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        raise InputError(command[0], f"cannot start it ({exc.strerror or exc})") from None

    def forward(signum, _frame):
        if signum == signal.SIGUSR1:
            pids = signal_ranks(dump_dir)
            _say(f"SIGUSR1 sent to {len(pids)} rank(s)" if pids else "no rank has a process group yet")
        elif signum != signal.SIGINT:  # the terminal already sent SIGINT to the child, our process group
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    previous = {s: signal.signal(s, forward) for s in (*FORWARDED, signal.SIGINT, signal.SIGUSR1)}
    try:
        while True:
            try:
                rc = child.wait()
                break
            except KeyboardInterrupt:  # pragma: no cover - handler above replaces SIGINT
                continue
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if rc < 0:
        rc = 128 - rc

    dumps = summarize_dumps(dump_dir)
    if dumps:
        _say(f"{len(dumps)} rank dump(s) in {dump_dir}")
        for rank, reason in dumps:
            _say(f"  rank {rank}: {reason}")
        _auto_diagnose(dump_dir)
        _say(f"next: distdoctor diagnose {dump_dir}")
    else:
        _say(f"no dumps written (no hang, no uncaught exception, nothing pending at exit); dump dir {dump_dir}")
    if rc != 0:
        _say(f"command exited with code {rc}")
    return rc
