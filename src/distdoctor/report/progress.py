"""Progress on stderr while a world runs (validate, bench, check): a rich bar on a terminal, one line per stage
otherwise. Each display yields the `on_event` callback that run_job feeds with the ranks' progress events."""

from __future__ import annotations

import contextlib
import sys

import click
from rich.console import Console


@contextlib.contextmanager
def progress_display(title: str):
    """A rich progress bar on stderr while the job runs (only on a terminal); yields an on_event callback."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    progress = Progress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                        TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True)
    task = progress.add_task("starting ranks", total=None)

    def on_event(ev: dict) -> None:
        if ev.get("type") == "progress":
            progress.update(task, completed=ev["done"], total=ev["total"], description=ev.get("what", ""))

    with progress:
        yield on_event


@contextlib.contextmanager
def check_progress(n_hint: str, quiet: bool = False):
    """Progress on stderr: a rich bar per stage on a terminal, one line per stage otherwise; nothing at all when
    `quiet` (a rank that does not report, under a launcher).

    The live display is started only at the first progress event, i.e. once the workers exist: CPU workers are
    forked, and no display thread should be running (and holding the stderr lock) at fork time.
    """
    if not quiet:
        click.echo(f"distdoctor check: starting {n_hint} …", err=True)
    state: dict = {"progress": None, "tasks": {}, "stage": None}
    tty = sys.stderr.isatty()

    def on_event(ev: dict) -> None:
        if ev.get("type") != "progress":
            return
        stage = ev.get("stage") or "run"
        if quiet:
            return
        if not tty:
            if stage != state["stage"]:
                state["stage"] = stage
                click.echo(f"distdoctor check: {stage} …", err=True)
            return
        if state["progress"] is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            state["progress"] = Progress(TextColumn("{task.fields[stage]:<9}"), BarColumn(), MofNCompleteColumn(),
                                         TextColumn("{task.description}"), TimeElapsedColumn(),
                                         console=Console(file=sys.stderr), transient=True)
            state["progress"].start()
        tasks = state["tasks"]
        if stage not in tasks:
            for other in tasks.values():  # the earlier stage is complete once the next one reports
                task = state["progress"].tasks[other]
                state["progress"].update(other, completed=task.total or task.completed)
            tasks[stage] = state["progress"].add_task(ev.get("what", ""), total=ev["total"], stage=stage)
        state["progress"].update(tasks[stage], completed=ev["done"], total=ev["total"], description=ev.get("what", ""))

    try:
        yield on_event
    finally:
        if state["progress"] is not None:
            state["progress"].stop()
