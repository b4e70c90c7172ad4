"""Progress on stderr while a world runs (validate, bench, check): a rich bar on a terminal, one line per stage
otherwise. Each display yields the `on_event` callback that run_job feeds with the ranks' progress events."""

from __future__ import annotations

import contextlib
import sys
import time

import click
from rich.console import Console


def _quiet_rank() -> bool:
    """Under a launcher only global rank 0 speaks (the others would print the same progress N times)."""
    from distdoctor.world.launchers import detect

    launch = detect()
    return launch is not None and launch.rank != 0


class _Lines:
    """Without a terminal: a line when the count of checks is known, then one at each quarter, with an estimate
    from the pace so far (a log or CI output shows how far it got and how long the rest should take)."""

    def __init__(self, title: str, unit: str):
        self.title, self.unit, self.said = title, unit, -1
        self.first: tuple[float, int] | None = None  # (time, done) of the first event: the pace excludes start-up

    def __call__(self, ev: dict) -> None:
        if ev.get("type") != "progress" or not ev.get("total"):
            return
        done, total, now = ev["done"], ev["total"], time.monotonic()
        if self.first is None:
            self.first = (now, done)
            click.echo(f"distdoctor {self.title}: {total} {self.unit} …", err=True)
        quarter = 4 * done // total
        if quarter <= max(self.said, 0) or done >= total:
            return
        self.said = quarter
        t0, done0 = self.first
        left = (now - t0) * (total - done) / max(done - done0, 1)
        click.echo(f"distdoctor {self.title}: {done}/{total} {self.unit}, about {left:.0f} s left", err=True)


@contextlib.contextmanager
def progress_display(title: str, unit: str = "checks"):
    """Progress on stderr while the job runs: on a terminal a rich bar with the count of `unit` done, the time
    taken and an estimate of the time left; otherwise a line at the start and at each quarter (_Lines); nothing
    on a rank other than global rank 0 under a launcher. Yields the on_event callback."""
    if _quiet_rank():
        yield None
        return
    if not sys.stderr.isatty():
        yield _Lines(title, unit)
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(TextColumn(title), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
                        TextColumn("{task.description}"), TimeElapsedColumn(), TextColumn("left"),
                        TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True)
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
