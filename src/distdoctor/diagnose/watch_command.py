"""`distdoctor watch --master-addr HOST --master-port PORT`: watch a running job from anywhere on its network.

The job's ranks serve their state through torch's worker servers (started by `distdoctor run` or
`distdoctor.recorder.enable()`, or by torch's `start_debug_server`), registered in the job's TCPStore; the watcher
polls them all (diagnose/live.py, live_watch.py) and prints a verdict when a hang is suspected or confirmed.
"""

from __future__ import annotations

import signal

import click

from distdoctor.errors import CheckFailed, InputError
from distdoctor.options import PORT, count, seconds


def _say(message: str) -> None:
    click.echo(f"distdoctor watch: {message}", err=True)


def _shout(message: str, nl: bool = True) -> None:
    click.echo(message, nl=nl)
    click.get_text_stream("stdout").flush()


@click.command("watch")
@click.option("--master-addr", required=True, help="The job's MASTER_ADDR (where its TCPStore listens).")
@click.option("--master-port", required=True, type=PORT, help="The job's MASTER_PORT.")
@click.option("--interval", type=seconds(0.05, 3600.0), default=1.0, show_default=True, help="Seconds between polls.")
@click.option("--timeout", type=seconds(0.05, 600.0), default=1.5, show_default=True,
              help="How long one rank may take to answer a poll; a rank slower than this is not waited for.")
@click.option("--world-size", type=count("ranks", 1, 1 << 20), default=None,
              help="The job's world size, when its store does not say (a job under torch's debug server only).")
@click.option("--attach-timeout", type=seconds(0.0, 86400.0), default=60.0, show_default=True,
              help="How long to wait for the job's store and its ranks to appear.")
@click.option("--once", is_flag=True, help="Exit after the first verdict (exit 1) instead of watching on.")
@click.option("--metrics-file", type=click.Path(dir_okay=False), default=None,
              help="Write the hang state and the ranks' signals in Prometheus' text format to FILE after each "
                   "poll (for node_exporter's textfile collector).")
@click.option("--job-name", default="distdoctor", show_default=True, help="The `job` label of the metrics.")
def watch_command(master_addr, master_port, interval, timeout, world_size, attach_timeout, once, metrics_file,
                  job_name) -> int:
    """Watch a running job through its store; print a verdict when it hangs."""
    from distdoctor.diagnose.live_watch import LiveWatch

    if not 0 < master_port < 65536:
        raise InputError("--master-port", f"must be a TCP port (1-65535), got {master_port}")
    for name, value in (("--interval", interval), ("--timeout", timeout), ("--attach-timeout", attach_timeout)):
        if not value > 0:
            raise InputError(name, f"must be a positive number of seconds, got {value:g}")
    metrics = _metrics_writer(metrics_file, job_name) if metrics_file else None
    watch = LiveWatch(master_addr, master_port, _say, _shout, interval, timeout, world_size, metrics=metrics)
    previous = {s: signal.signal(s, lambda *_: watch.stop_event.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        level = watch.run(attach_s=attach_timeout, once=once)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if watch.job is None:
        raise InputError(f"{master_addr}:{master_port}", "no job to watch there")
    if once and level:
        raise CheckFailed(1)
    return 0


def _metrics_writer(path: str, job_name: str):
    from distdoctor.diagnose.live_metrics import exposition, write_file

    def write(watch) -> None:
        try:
            write_file(path, exposition(watch, job_name))
        except OSError as exc:
            raise InputError("--metrics-file", f"{path} cannot be written ({exc.strerror})") from None

    return write
