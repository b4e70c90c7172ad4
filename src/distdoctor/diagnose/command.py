"""`distdoctor diagnose PATH...`: load per-rank traces, analyze, report. Exit 0 ok, 1 problem, 2 nothing usable."""

from __future__ import annotations

import json
import os

import click

from distdoctor.errors import CheckFailed, InputError


def is_superseded(err) -> bool:
    """A Flight Recorder dump beside the recorder's own trace of the same rank (what `distdoctor run` writes)."""
    return "is preferred over flight_recorder" in err.reason


@click.command("diagnose")
@click.argument("paths", nargs=-1, required=True)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True,
              help="json: one JSON document on stdout and nothing else there; html: one self-contained file.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write diagnose.txt, diagnose.json, diagnose.html and diagnose.trace.json into DIR.")
@click.option("--chrome-trace", "chrome_trace", type=click.Path(dir_okay=False), default=None,
              help="Write a Perfetto/Chrome trace of the collectives per rank to FILE.")
@click.option("--world-size", type=click.IntRange(min=1), default=None,
              help="The job's world size, when the dumps cannot tell (e.g. the last ranks left no dump).")
# Per-rank text logs (trace/loaders/logs.py): how to read their rank and their begin/end markers.
@click.option("--log-rank", "log_rank", metavar="REGEX", default=None,
              help="Per-rank logs: a regex with a (?P<rank>...) group, searched in each log's path "
                   "(default: rank_<r>, rank<r>, rank-<r> in the file name or a folder).")
@click.option("--begin", "begin", metavar="REGEX", default=None,
              help="Per-rank logs: the line that begins an op, with (?P<op>...) and, if the line has one, "
                   "(?P<thread>...) (default: glog lines '... <tid> file:line] before: <op>').")
@click.option("--end", "end", metavar="REGEX", default=None,
              help="Per-rank logs: the line that ends an op, with the same groups as --begin (default: 'after: <op>').")
def diagnose_command(paths: tuple[str, ...], fmt: str, out_dir: str | None, chrome_trace: str | None,
                     world_size: int | None, log_rank: str | None, begin: str | None, end: str | None) -> None:
    """Explain a hang or desync from per-rank traces (Flight Recorder dumps, distdoctor traces, per-rank logs).

    PATH is a trace file or a directory of them, in any mix of formats.
    """
    from distdoctor.diagnose.analyze import analyze
    from distdoctor.report.chrome_trace import write_chrome_trace
    from distdoctor.report.diagnose_chrome import diagnose_spans
    from distdoctor.report.diagnose_text import render_text
    from distdoctor.report.html import render_html
    from distdoctor.trace.loaders import gc_paused, load_traces
    from distdoctor.trace.loaders.logs import LogFormat, using_format

    try:
        log_format = LogFormat(begin=begin, end=end, rank=log_rank)
    except ValueError as exc:  # the message names the flag
        flag, _, why = str(exc).partition(": ")
        raise InputError(flag, why) from None
    with using_format(log_format):
        ts = load_traces(list(paths), world_size=world_size)
    if not ts.ranks:
        reasons = "; ".join(str(e) for e in ts.errors[:5]) or "no trace files found"
        more = f" (and {len(ts.errors) - 5} more)" if len(ts.errors) > 5 else ""
        raise InputError(" ".join(paths), f"no usable trace: {reasons}{more}")
    if world_size is not None and ts.world_size and ts.world_size > world_size:
        raise InputError("--world-size", f"{world_size} is smaller than the traces show ({ts.world_size})")
    try:
        with gc_paused():  # the analysis makes few cycles; rescanning millions of loaded entries would cost more
            report = analyze(ts)
    except Exception as exc:  # a trace shape the analysis does not handle: say so in one line, not a traceback
        raise InputError(" ".join(paths), f"analysis failed on these traces ({type(exc).__name__}: {exc}); "
                                          f"please report it with the files") from exc
    superseded = [e for e in ts.errors if is_superseded(e)]
    for err in ts.errors:
        if not is_superseded(err):
            click.echo(f"distdoctor diagnose: warning: {err}", err=True)
    from distdoctor.trace.loaders import fr_json_scan

    if fr_json_scan.FAILURE:
        click.echo(f"distdoctor diagnose: note: the compiled JSON scanner could not start ({fr_json_scan.FAILURE}); "
                   f"dumps were read entry by entry, which is slower", err=True)
    if superseded:
        click.echo(f"distdoctor diagnose: note: {len(superseded)} Flight Recorder dump(s) not used: the distdoctor "
                   f"traces of the same ranks are preferred", err=True)

    renderers = {"text": render_text, "json": lambda r: json.dumps(r.to_json(), indent=2) + "\n",
                 "html": render_html}
    if out_dir:
        try:
            os.makedirs(out_dir, exist_ok=True)
            for kind, name in (("text", "diagnose.txt"), ("json", "diagnose.json"), ("html", "diagnose.html")):
                with open(os.path.join(out_dir, name), "w") as f:
                    f.write(renderers[kind](report))
            write_chrome_trace(diagnose_spans(report), os.path.join(out_dir, "diagnose.trace.json"),
                               title="distdoctor diagnose")
        except OSError as exc:
            raise InputError(out_dir, f"cannot write the report ({exc.strerror})") from None
        click.echo(f"distdoctor diagnose: reports written to {out_dir}", err=True)
    if chrome_trace:
        try:
            write_chrome_trace(diagnose_spans(report), chrome_trace, title="distdoctor diagnose")
        except OSError as exc:
            raise InputError(chrome_trace, f"cannot write the trace ({exc.strerror})") from None
    click.echo(renderers[fmt](report), nl=False)
    if report.verdict != "ok":
        raise CheckFailed(1)
