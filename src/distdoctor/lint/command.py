"""`distdoctor lint PATH...`: latent deadlock hazards in the dumps of a run that did not hang.
Exit 0 clean, 1 hazards, 2 bad input (one line naming it)."""

from __future__ import annotations

import click

from distdoctor.errors import CheckFailed, InputError
from distdoctor.options import count


def render_text(report) -> str:
    from distdoctor.lint.hazard import to_finding
    from distdoctor.report.findings import finding_lines

    ts = report.traces
    n = len(report.hazards)
    head = "HAZARDS" if n else "CLEAN"
    lines = [f"verdict: {head} - {n} hazard{'s' if n != 1 else ''}; world size {ts.world_size}, "
             f"{len(ts.ranks)} trace{'s' if len(ts.ranks) != 1 else ''} loaded"
             + (f", {len(ts.errors)} file(s) unusable" if ts.errors else "")]
    if not n:
        lines.append("No latent deadlock hazard found in these traces (evidence: "
                     + "; ".join(f"{k}: {v}" for k, v in report.evidence.items()) + ").")
    lines.extend(finding_lines([to_finding(h) for h in report.hazards]))
    if ts.errors:
        lines.append("")
        lines.append("files not used:")
        lines.extend(f"  {e.path}: {e.reason}" for e in ts.errors)
    return "\n".join(lines) + "\n"


@click.command("lint")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one JSON document on stdout and nothing else there.")
@click.option("--world-size", type=count("ranks", 1, 1 << 20), default=None,
              help="The job's world size, when the dumps cannot tell.")
@click.option("--recursive", "-r", is_flag=True,
              help="Also read the files in the subdirectories of a directory PATH (default: its own files only).")
def lint_command(paths: tuple[str, ...], fmt: str, world_size: int | None, recursive: bool) -> None:
    """Latent deadlock hazards in the dumps of a run that did NOT hang (recorder dumps from `distdoctor run
    --dump-on-exit`, Flight Recorder pickle or JSON dumps): order inversions across groups, rank-conditional
    collectives, p2p orders that need buffering, groups created in different orders, false waits on shared streams.

    PATH is a trace file or a directory of them. Exit 0 clean, 1 hazards, 2 bad input.
    """
    from distdoctor.diagnose.command import load_with_subdirs, skip_kind
    from distdoctor.lint.analyze import lint
    from distdoctor.trace.loaders import gc_paused, load_traces

    ts, _ = load_with_subdirs(paths, lambda deep: load_traces(list(paths), world_size=world_size, recursive=deep),
                              recursive, "distdoctor lint")
    if not ts.ranks:
        real = [e for e in ts.errors if not skip_kind(e, paths)]
        reasons = "; ".join(str(e) for e in real[:3]) or "no trace files found"
        raise InputError(" ".join(paths), f"no usable trace: {reasons}")
    try:
        with gc_paused():
            report = lint(ts)
    except Exception as exc:  # a trace shape a check does not handle: one line, not a traceback
        raise InputError(" ".join(paths), f"lint failed on these traces ({type(exc).__name__}: {exc}); "
                                          f"please report it with the files") from exc
    for err in ts.errors:
        if not skip_kind(err, paths):
            click.echo(f"distdoctor lint: warning: {err}", err=True)
    if fmt == "json":
        from distdoctor.report.json_text import indented_json

        click.echo(indented_json(report.to_json()))
    else:
        click.echo(render_text(report), nl=False)
    if report.hazards:
        raise CheckFailed(1)
