"""`distdoctor diagnose PATH...`: load per-rank traces, analyze, report. Exit 0 ok, 1 problem, 2 nothing usable."""

from __future__ import annotations

import functools
import os

import click

from distdoctor.errors import CheckFailed, InputError
from distdoctor.options import count


# Files found in a directory that are plainly not traces (a directory of mixed content): counted in one line, not
# one warning each. A file named on the command line, a corrupt or an empty dump still get a warning of their own.
_NOT_A_TRACE = {"unrecognized format": "not a trace format", "JSON but not a trace": "JSON but not a trace"}


def skip_kind(err, named: tuple[str, ...] = ()) -> str | None:
    """The kind of a skipped path (a subdirectory not read, a file that is no trace), or None for a real problem."""
    from distdoctor.trace.loaders import SUBDIR_NOT_READ

    if err.reason == SUBDIR_NOT_READ:
        return "subdirectory"
    if err.path in named:
        return None
    return next((kind for prefix, kind in _NOT_A_TRACE.items() if err.reason.startswith(prefix)), None)


def summarize_skipped(skipped: list) -> str:
    """One line: how many files were skipped and why, one example, and how to read subdirectories."""
    from collections import Counter

    kinds = Counter(skip_kind(e) for e in skipped)
    n_dirs = kinds.pop("subdirectory", 0)
    parts = []
    files = sum(kinds.values())
    if files:
        example = next(e.path for e in skipped if skip_kind(e) != "subdirectory")
        detail = ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
        parts.append(f"skipped {files} file(s) that are not traces ({detail}; e.g. {example})")
    if n_dirs:
        parts.append(f"did not read {n_dirs} subdirector{'y' if n_dirs == 1 else 'ies'} (--recursive reads them)")
    return "; ".join(parts)


MAX_TRACE_FILE = 1 << 30  # one rank's Flight Recorder dump or distdoctor trace is megabytes; 1 GiB is not one
SNIFF_ABOVE = 64 << 20  # files in a directory larger than this have their head checked (a sparse file of NULs)


def check_trace_inputs(paths, recursive: bool) -> None:
    """Refuse, with the reason and before any loader reads a byte, a PATH that is no file or directory (a FIFO, a
    device, a link loop, a sparse or zeroed file) and any file to be read that is larger than a trace can be."""
    from distdoctor.options import check_input_path, human_bytes
    from distdoctor.trace.loaders import expand_paths

    dirs = [p for p in paths if check_input_path(p, MAX_TRACE_FILE, "a trace")]
    for path in expand_paths(dirs, recursive)[0]:
        try:
            size = os.stat(path).st_size
        except OSError:
            continue
        if size > MAX_TRACE_FILE:
            raise InputError(path, f"is {human_bytes(size)}, above the {human_bytes(MAX_TRACE_FILE)} limit for a "
                                   f"trace (move it out of the directory)")
        if size > SNIFF_ABOVE:  # a large file is looked at before a reader spends its whole length on it
            check_input_path(path, MAX_TRACE_FILE, "a trace (move it out of the directory)")


def load_with_subdirs(paths, load, recursive: bool, prog: str):
    """load(recursive) -> TraceSet; returns (the set, whether it was read recursively). A directory whose own files
    hold no trace but whose subdirectories hold the ranks' files (logs/rank_0/..., as many launchers write them)
    is read whole, and stderr says so. Every file is checked (check_trace_inputs) before it is read."""
    from distdoctor.trace.loaders import SUBDIR_NOT_READ

    check_trace_inputs(paths, recursive)
    ts = checked(load(recursive))
    if recursive or ts.ranks or not any(e.reason == SUBDIR_NOT_READ for e in ts.errors):
        return ts, recursive
    check_trace_inputs(paths, True)
    deeper = checked(load(True))
    if not deeper.ranks:
        return ts, False
    click.echo(f"{prog}: note: no trace among the files of {' '.join(paths)} itself: read its subdirectories "
               f"({len(deeper.ranks)} rank trace(s) there)", err=True)
    return deeper, True


def checked(ts):
    """The set, or InputError naming the first trace whose numbers are impossible (trace.model.trace_problem)."""
    from distdoctor.trace.model import trace_problem

    for trace in ts.ranks.values():
        problem = trace_problem(trace)
        if problem:
            raise InputError(trace.path or f"rank {trace.rank}", problem)
    return ts


def _collector_paused(command):
    """The whole command without the cyclic garbage collector: loading, analysis and rendering make few cycles,
    and each collection rescans everything loaded (3 s of a 16 384-rank diagnosis, all of it serial)."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        from distdoctor.trace.loaders import gc_paused

        with gc_paused():
            return command(*args, **kwargs)
    return run


@click.command("diagnose")
@click.argument("paths", nargs=-1, required=False)
@click.option("--format", "fmt", type=click.Choice(["text", "json", "html"]), default="text", show_default=True,
              help="json: one JSON document on stdout and nothing else there; html: one self-contained file.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write diagnose.txt, diagnose.json, diagnose.html and diagnose.trace.json into DIR.")
@click.option("--chrome-trace", "chrome_trace", type=click.Path(dir_okay=False), default=None,
              help="Write a Perfetto/Chrome trace of the collectives per rank to FILE.")
@click.option("--world-size", type=count("ranks", 1, 1 << 20), default=None,
              help="The job's world size, when the dumps cannot tell (e.g. the last ranks left no dump).")
@click.option("--recursive", "-r", is_flag=True,
              help="Also read the files in the subdirectories of a directory PATH (default: its own files only).")
# Per-rank text logs (trace/loaders/logs.py): how to read their rank and their begin/end markers.
@click.option("--log-rank", "log_rank", metavar="REGEX", default=None,
              help="Per-rank logs: a regex with a (?P<rank>...) group, searched in each log's path "
                   "(default: rank_<r>, rank<r>, rank-<r> in the file name or a folder).")
@click.option("--begin", "begin", metavar="REGEX", default=None,
              help="Per-rank logs: the line that begins an op, with (?P<op>...) and, if the line has one, "
                   "(?P<thread>...) (default: glog lines '... <tid> file:line] before: <op>').")
@click.option("--end", "end", metavar="REGEX", default=None,
              help="Per-rank logs: the line that ends an op, with the same groups as --begin (default: 'after: <op>').")
@click.option("--live", "live", metavar="HOST:PORT", default=None,
              help="Read a running job's state from every rank through its store (MASTER_ADDR:MASTER_PORT) "
                   "instead of trace files: ranks under distdoctor run or torch's start_debug_server.")
@_collector_paused
def diagnose_command(paths: tuple[str, ...], fmt: str, out_dir: str | None, chrome_trace: str | None,
                     world_size: int | None, recursive: bool, log_rank: str | None, begin: str | None,
                     end: str | None, live: str | None = None) -> None:
    """Explain a hang or desync from per-rank traces (Flight Recorder dumps, distdoctor traces, per-rank logs).

    PATH is a trace file or a directory of them, in any mix of formats.
    Files that are not traces are skipped and counted in one line.
    """
    from distdoctor.diagnose.analyze import analyze
    from distdoctor.report.chrome_trace import write_chrome_trace
    from distdoctor.report.diagnose_chrome import diagnose_spans
    from distdoctor.report.diagnose_text import merged_note, render_text
    from distdoctor.report.html import render_html
    from distdoctor.report.json_text import indented_json
    from distdoctor.trace.loaders import load_traces
    from distdoctor.trace.loaders.logs import LogFormat, using_format

    try:
        log_format = LogFormat(begin=begin, end=end, rank=log_rank)
    except ValueError as exc:  # the message names the flag
        flag, _, why = str(exc).partition(": ")
        raise InputError(flag, why) from None
    if live is not None:
        return _diagnose_live(live, paths, fmt, world_size)
    if not paths:
        raise InputError("PATH", "give trace files or directories (or --live HOST:PORT for a running job)")

    def load(deep: bool, stream="auto"):
        with using_format(log_format):
            return load_traces(list(paths), world_size=world_size, recursive=deep, stream=stream)

    ts, recursive = load_with_subdirs(paths, load, recursive, "distdoctor diagnose")
    if not ts.ranks:
        real = [e for e in ts.errors if not skip_kind(e, paths)]
        reasons = "; ".join(str(e) for e in real[:5])
        reasons += f" (and {len(real) - 5} more)" if len(real) > 5 else ""
        skipped = [e for e in ts.errors if skip_kind(e, paths)]
        if skipped:
            reasons += ("; " if reasons else "") + summarize_skipped(skipped)
        raise InputError(" ".join(paths), f"no usable trace: {reasons or 'no trace files found'}")
    if world_size is not None and ts.world_size and ts.world_size > world_size:
        raise InputError("--world-size", f"{world_size} is smaller than the traces show ({ts.world_size})")
    try:
        report = analyze(ts)
        if ts.streamed and (not report.findings or any(f.kind == "straggler" for f in report.findings)):
            # stragglers compare the times of every entry all ranks hold: only the whole set has them
            ts = load(recursive, stream=False)
            report = analyze(ts)
    except Exception as exc:  # a trace shape the analysis does not handle: say so in one line, not a traceback
        raise InputError(" ".join(paths), f"analysis failed on these traces ({type(exc).__name__}: {exc}); "
                                          f"please report it with the files") from exc
    skipped = [e for e in ts.errors if skip_kind(e, paths)]
    for err in ts.errors:
        if not skip_kind(err, paths):
            click.echo(f"distdoctor diagnose: warning: {err}", err=True)
    if skipped:
        click.echo(f"distdoctor diagnose: note: {summarize_skipped(skipped)}; --format json lists every path "
                   f"under load_errors", err=True)
    from distdoctor.trace.loaders import fr_json_scan, fr_pickle_scan

    for reader, module, instead in (("JSON scanner", fr_json_scan, "dumps were read entry by entry"),
                                    ("pickle reader", fr_pickle_scan, "pickles were read by the unpickler")):
        if module.FAILURE:
            click.echo(f"distdoctor diagnose: note: the compiled {reader} could not start ({module.FAILURE}); "
                       f"{instead}, which is slower", err=True)
    merged = [t for t in ts.ranks.values() if t.merged]
    if merged:
        click.echo(f"distdoctor diagnose: note: {merged_note(merged)}", err=True)

    renderers = {"text": render_text, "json": lambda r: indented_json(r.to_json()) + "\n",
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


def _diagnose_live(endpoint: str, paths: tuple[str, ...], fmt: str, world_size: int | None) -> None:
    """`diagnose --live HOST:PORT`: the same analysis over every rank's live state (diagnose/live_watch.py)."""
    from distdoctor.diagnose.live import parse_endpoint
    from distdoctor.diagnose.live_watch import JobMoving, snapshot
    from distdoctor.report.diagnose_text import render_text
    from distdoctor.report.json_text import indented_json

    if paths:
        raise InputError("--live", "reads a running job instead of trace files: give PATH or --live, not both")
    if fmt == "html":
        raise InputError("--format", "html is made from trace files; with --live use text or json")
    addr, port = parse_endpoint(endpoint)
    try:
        ts, report, lines = snapshot(addr, port, world_size)
    except JobMoving as moving:
        from distdoctor.findings.kinds import fmt_ranks

        why = (f"the job is moving: {fmt_ranks(moving.ranks)} completed collectives while every rank was read, so "
               "there is no single picture to diagnose (distdoctor watch waits for a hang)")
        click.echo(indented_json({"verdict": "none", "reason": why, "moving_ranks": moving.ranks}) if fmt == "json"
                   else f"verdict: NONE - {why}")
        return
    if not ts.ranks:
        raise InputError(endpoint, "no rank answered: " + ("; ".join(lines[:3]) or "nothing registered"))
    if fmt == "json":
        doc = report.to_json()
        doc["live"] = {"store": f"{addr}:{port}", "not_answering": lines}
        click.echo(indented_json(doc))
    else:
        click.echo(render_text(report), nl=False)
        if lines:
            click.echo("ranks that did not answer:")
            for line in lines:
                click.echo("  " + line)
    if report.verdict != "ok" or lines:
        raise CheckFailed(1)
