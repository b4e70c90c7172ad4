"""`distdoctor sim`: run a plan (a file, a shipped example, or a generated pipeline / FSDP plan).

Exit codes: 0 nothing found, 1 a deadlock or a desync (the report is printed first; diagnose's findings), 2 bad
input (one line on stderr).
Every output file (--chrome-trace, --png, --emit-trace, --emit-ir) is written before the exit code is set,
so a deadlocked plan still leaves its pictures and traces behind.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import resources
from pathlib import Path

import click

from distdoctor.cli import FORMAT_OPTION
from distdoctor.errors import CheckFailed, InputError
from distdoctor.options import SEED, ByteSize, MiB, Number, check_input_file, count, microseconds
from distdoctor.sim.fr_nccl import FAULTS as FR_FAULTS
from distdoctor.sim.ir import Program, dump_program, load_program
from distdoctor.sim.plans.fsdp import FsdpConfig, build_fsdp
from distdoctor.sim.plans.p2p_calls import COMM_INIT, P2P_ORDERS, CallsConfig, build_calls
from distdoctor.sim.plans.pipeline import SCHEDULES, PipelineConfig, build_pipeline
from distdoctor.sim.result import simulate

EXAMPLES_PACKAGE = "distdoctor.sim"
PNG_ROWS = 48  # streams drawn in a timeline PNG (blocked ones first)
MAX_TRIALS = 10_000  # jittered timing trials: each is a whole simulation
# A generated plan is built whole in memory (~0.5 KB and ~20 us per op): its size is the product of counts that
# are each capped, so the product is capped too, before anything is built (a generated op per rank, micro-batch
# or unit and step is at most ~12: send, receive, compute, buffer and event ops).
MAX_OPS = 4_000_000
OPS_PER_UNIT = 12


def check_plan_size(what: str, units: int) -> None:
    if units * OPS_PER_UNIT > MAX_OPS:
        n, cap = (f"{x:_}".replace("_", " ") for x in (units * OPS_PER_UNIT, MAX_OPS))
        raise InputError(what, f"the plan would hold about {n} ops, above the {cap} a generated plan may hold: "
                               "give smaller counts")
MAX_STEPS = 10_000


def examples_dir() -> Path:
    return Path(str(resources.files(EXAMPLES_PACKAGE))) / "examples"


def _example_summary(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


MAX_PLAN = 64 * MiB  # a generated plan of thousands of ranks is megabytes; a plan file is read and parsed whole


def resolve_plan(name: str) -> Path:
    p = Path(name)
    if os.path.lexists(p):  # a path, even a broken link or a FIFO: refused for what it is, before it is read
        check_input_file(name, MAX_PLAN, "a plan")
        return p
    for cand in (examples_dir() / name, examples_dir() / f"{name}.yaml"):
        if cand.exists():
            return cand
    raise InputError(name, "no such file (nor a shipped example; `distdoctor sim examples` lists them)")


def _output_options(f):
    f = click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the first timing trial.")(f)
    f = click.option("--jitter", type=Number("fraction", 0, 1), default=0.2, show_default=True,
                     help="Compute-time jitter of the timing trials (0.2: each op x U[0.8, 1.2]).")(f)
    f = click.option("--trials", type=count("trials", 0, MAX_TRIALS), default=0, show_default=True,
                     help="Also try N jittered timings when the nominal one runs: can it deadlock?")(f)
    f = click.option("--emit-trace", "emit_trace", type=click.Path(file_okay=False),
                     help="Write rank_<r>.jsonl per rank (distdoctor trace format) as the run ends.")(f)
    f = click.option("--png", "png", type=click.Path(dir_okay=False), help="Timeline PNG per rank and stream.")(f)
    f = click.option("--chrome-trace", "chrome", type=click.Path(dir_okay=False),
                     help="Perfetto/Chrome trace JSON of the timeline.")(f)
    f = click.option("--emit-ir", "emit_ir", type=click.Path(dir_okay=False),
                     help="Write the program IR (YAML, or JSON for .json names).")(f)
    return FORMAT_OPTION(f)


def _finish(prog: Program, fmt: str, emit_ir, chrome, png, emit_trace, trials=0, jitter=0.2, seed=0,
            header: str = "", preface: str = "", extra: dict | None = None, tail=None,
            jitter_comm: bool = False) -> None:
    """`tail(result)`, when given, returns (JSON fields, a text line) about the result for this command."""
    if emit_ir:
        _write(emit_ir, lambda: dump_program(prog, emit_ir, header=header))
    detail = bool(chrome or png or emit_trace)
    res = simulate(prog, detail=detail, trials=trials, jitter=jitter, seed=seed, jitter_comm=jitter_comm)
    more, line = tail(res) if tail else ({}, "")
    if chrome:
        from distdoctor.report.chrome_trace import write_chrome_trace
        from distdoctor.sim.emit import to_spans

        _write(chrome, lambda: write_chrome_trace(to_spans(res), chrome, title=f"distdoctor sim {prog.source}"))
    if png:
        from distdoctor.report.timeline_png import write_timeline_png
        from distdoctor.sim.emit import picture_rows, to_spans

        verdict = "DEADLOCK" if res.deadlock else "no deadlock"
        rows = picture_rows(res, PNG_ROWS)
        _write(png, lambda: write_timeline_png(to_spans(res, rows), png, title=f"{prog.source}: {verdict}",
                                               max_rows=PNG_ROWS, total_rows=len(res.state.compiled.streams)))
    if emit_trace:
        from distdoctor.sim.emit import write_rank_traces

        _write(emit_trace, lambda: write_rank_traces(res, emit_trace))
    if fmt == "json":
        click.echo(json.dumps({**res.to_json(), **(extra or {}), **more}))
    else:
        if preface:
            click.echo(preface)
        click.echo(res.to_text())
        if line:
            click.echo(line)
        for what, path in (("IR", emit_ir), ("Chrome trace", chrome), ("timeline", png), ("traces", emit_trace)):
            if path:
                click.echo(f"{what} written to {path}", err=True)
    if res.deadlock or res.findings():  # a desync too, as in diagnose
        raise CheckFailed(1)


def _write(path: str, fn) -> None:
    try:
        fn()
    except OSError as exc:
        raise InputError(path, f"cannot write ({exc.strerror or exc})") from None


@click.group("sim")
def sim_group() -> None:
    """Simulate a parallel plan: deadlocks, bubbles and needless waits, before launch.

    Exit code 1 when the plan can deadlock or desyncs, 0 when it cannot, 2 on bad input.
    """


@sim_group.command("run")
@click.argument("plan")
@_output_options
def run_command(plan: str, fmt: str, emit_ir, chrome, png, emit_trace, trials, jitter, seed) -> None:
    """Simulate PLAN, a YAML/JSON program file or the name of a shipped example."""
    prog = load_program(resolve_plan(plan))
    _finish(prog, fmt, emit_ir, chrome, png, emit_trace, trials, jitter, seed)


@sim_group.command("pipeline")
@click.option("--stages", type=count("stages", 1, 4096), default=4, show_default=True, help="Pipeline stages P.")
@click.option("--microbatches", type=count("micro-batches", 1, 1 << 16), default=8, show_default=True, help="Micro-batches M per step.")
@click.option("--schedule", type=click.Choice(SCHEDULES), default="1f1b", show_default=True,
              help="Pipeline schedule: all forwards then all backwards, one-forward-one-backward, or interleaved.")
@click.option("--chunks", type=count("chunks", 1, 64), default=None, help="Model chunks per rank V (interleaved; default 2).")
@click.option("--dp", type=count("ranks", 1, 1 << 16), default=1, show_default=True, help="Data-parallel degree D.")
@click.option("--tp", type=count("ranks", 1, 1 << 16), default=1, show_default=True, help="Tensor-parallel degree T.")
@click.option("--fwd-us", type=microseconds(), default=1000.0, show_default=True, help="Forward time per micro-batch.")
@click.option("--bwd-us", type=microseconds(), default=2000.0, show_default=True, help="Backward time per micro-batch.")
@click.option("--act-buffer", type=count("slots", 0, 1 << 16), default=None,
              help="Activation slots per stage [default: what the schedule needs].")
@click.option("--streams", type=click.IntRange(1, 2), default=None,
              help="Forward and backward on separate streams (2, the default) or one (1).")
@click.option("--steps", type=count("steps", 1, MAX_STEPS), default=1, show_default=True, help="Training steps (iterations).")
@click.option("--act-bytes", type=ByteSize(), default=8 << 20, show_default=True, help="Activation/gradient p2p bytes.")
@click.option("--grad-bytes", type=ByteSize(), default=256 << 20, show_default=True, help="DP gradient all-reduce bytes.")
@click.option("--grad-recv-stream", type=click.Choice(["bwd", "fwd"]), default="bwd", show_default=True,
              help="Stream of the op that receives the backward's input gradient (--streams 2).")
@click.option("--zero-comm", is_flag=True, help="All communication takes no time (analytic checks).")
@click.option("--alpha-us", type=microseconds(), default=5.0, show_default=True, help="Per-message latency.")
@click.option("--gbps", type=Number("GB/s", 0, 1e9, low_open=True), default=100.0, show_default=True, help="Bus bandwidth, GB/s.")
@click.option("--p2p-order", type=click.Choice(P2P_ORDERS), default=None,
              help="Run the host's compute and p2p calls on one stream (Megatron-LM's call order), each call's "
                   "ops in this order (see docs/sim.md).")
@click.option("--eager-bytes", type=ByteSize(), default=0, show_default=True,
              help="Per-channel buffer: sends that fit complete before their receive; 0: every send waits for it.")
@click.option("--comm-init", type=click.Choice(COMM_INIT), default=None,
              help="With --p2p-order: create the communicators in the plan (eager, lazy, neighbors).")
@_output_options
def pipeline_command(fmt, emit_ir, chrome, png, emit_trace, trials, jitter, seed, chunks, streams, p2p_order,
                     eager_bytes, comm_init, **kw) -> None:
    """Pipeline x data x tensor parallel training steps (GPipe, 1F1B, interleaved)."""
    if chunks is None:
        chunks = 2 if kw["schedule"] == "interleaved" else 1
    check_plan_size("--stages x --microbatches x --chunks x --dp x --tp x --steps",
                    kw["stages"] * kw["microbatches"] * chunks * kw["dp"] * kw["tp"] * kw["steps"])
    cfg = PipelineConfig(chunks=chunks, streams=streams or 2, **kw)
    if p2p_order is not None:
        calls = CallsConfig(p2p_order, comm_init, eager_bytes)
        calls.check(streams is not None, cfg.tp, cfg.dp)
        cfg.check()
        prog = build_calls(cfg, calls)
    elif comm_init is not None:
        raise InputError("--comm-init", "needs --p2p-order (the host-driven call model)")
    else:
        prog = build_pipeline(cfg)
        prog.eager_bytes = eager_bytes
    _finish(prog, fmt, emit_ir, chrome, png, emit_trace, trials, jitter, seed, header=_header(prog))


@sim_group.command("fsdp")
@click.option("--ranks", type=count("ranks", 1, 1 << 16), default=8, show_default=True, help="Ranks in the world.")
@click.option("--shard-group", type=count("ranks", 1, 1 << 16), default=4, show_default=True, help="Ranks per shard group (HSDP).")
@click.option("--units", type=count("units", 1, 1 << 16), default=8, show_default=True, help="FSDP units (wrapped modules).")
@click.option("--unshard-streams", type=click.Choice(["shared", "per-group"]), default="shared", show_default=True,
              help="One unshard (all-gather) stream for every group, or one per process group.")
@click.option("--prefetch", type=count("all-gathers", 0, 1 << 16), default=1, show_default=True, help="All-gathers issued ahead of compute.")
@click.option("--compute-us", type=microseconds(), default=100.0, show_default=True, help="Forward time per unit.")
@click.option("--ag-us-global", type=microseconds(), default=300.0, show_default=True, help="All-gather over all ranks.")
@click.option("--ag-us-local", type=microseconds(), default=50.0, show_default=True, help="All-gather in a shard group.")
@click.option("--local-every", type=count("units", 1, 1 << 16), default=2, show_default=True,
              help="Every k-th unit is sharded in the shard group, the rest over all ranks.")
@click.option("--backward/--no-backward", default=True, show_default=True,
              help="Also simulate the backward pass (re-gathers and reduce-scatters).")
@click.option("--steps", type=count("steps", 1, MAX_STEPS), default=1, show_default=True, help="Training steps (iterations).")
@_output_options
def fsdp_command(fmt, emit_ir, chrome, png, emit_trace, trials, jitter, seed, **kw) -> None:
    """FSDP/HSDP all-gathers on a shared or per-group unshard stream, with prefetch."""
    check_plan_size("--ranks x --units x --steps", kw["ranks"] * kw["units"] * kw["steps"])
    prog = build_fsdp(FsdpConfig(**kw))
    _finish(prog, fmt, emit_ir, chrome, png, emit_trace, trials, jitter, seed, header=_header(prog))


@sim_group.command("torch-schedule")
@click.argument("schedule", required=False)
@click.option("--csv", "csv_path", default=None,
              help="A schedule in torch's CSV form (one row of actions per rank) instead of a class name.")
@click.option("--stages", type=count("stages", 1, 4096), default=None, help="Pipeline stages in all (a CSV: inferred).")
@click.option("--microbatches", type=count("micro-batches", 1, 1 << 16), default=None, help="Micro-batches per step (a CSV: inferred).")
@click.option("--ranks", type=count("ranks", 1, 4096), default=None,
              help="Pipeline ranks [default: --stages for one-stage-per-rank schedules, else --stages / 2].")
@click.option("--fwd-us", type=microseconds(), default=1000.0, show_default=True, help="Forward (F) time per stage.")
@click.option("--bwd-us", type=microseconds(), default=2000.0, show_default=True, help="Full backward (B) time.")
@click.option("--bwd-input-us", type=microseconds(), default=None, help="Backward for inputs (I) [default: half of B].")
@click.option("--bwd-weight-us", type=microseconds(), default=None, help="Backward for weights (W) [default: half of B].")
@click.option("--p2p-us", type=microseconds(), default=50.0, show_default=True, help="Time of one send/receive.")
@click.option("--p2p-bytes", type=ByteSize(), default=0, show_default=True,
              help="Size of one activation or gradient (matters with --eager-bytes).")
@click.option("--eager-bytes", type=ByteSize(), default=0, show_default=True,
              help="Per-peer buffer for sends that complete before their receive; 0: every send is a rendezvous.")
@click.option("--comm-model", type=click.Choice(["nccl", "coalesced", "ideal"]), default="nccl", show_default=True,
              help="nccl: a stream per peer pair, each op synchronized with compute when posted (torch's runtime "
                   "on NCCL); coalesced: one p2p stream per rank; ideal: no false waits (the analytic bound).")
@click.option("--defer-recv", is_flag=True, help="torch's defer_pp_recv: receives right before their consumer.")
@click.option("--emit-csv", "emit_csv", type=click.Path(dir_okay=False),
              help="Write the action lists as simulated (with sends and receives) in torch's CSV form.")
@click.option("--list", "list_only", is_flag=True, help="List the schedule classes the installed torch ships.")
@_output_options
def torch_schedule_command(schedule, csv_path, stages, microbatches, ranks, fwd_us, bwd_us, bwd_input_us,
                           bwd_weight_us, p2p_us, p2p_bytes, eager_bytes, comm_model, defer_recv, emit_csv, list_only,
                           fmt, emit_ir, chrome, png, emit_trace, trials, jitter, seed) -> None:
    """Simulate what torch.distributed.pipelining would run: SCHEDULE is a torch schedule class
    (Interleaved1F1B, ZBVZeroBubble, ...), or --csv FILE a schedule in torch's CSV form.

    Exit code 1 when the action lists are invalid (each problem is reported) or deadlock, 2 on bad input.
    """
    from distdoctor.sim.plans.schedule_program import ScheduleTiming
    from distdoctor.sim.schedule_report import dump_csv, findings_json, findings_text, load_schedule

    if list_only:
        from distdoctor.sim.plans.torch_schedule import schedule_classes

        for short, cls in schedule_classes().items():
            click.echo(f"{short:<24} {cls.__name__}")
        return
    for flag, v in (("--fwd-us", fwd_us), ("--bwd-us", bwd_us), ("--bwd-input-us", bwd_input_us),
                    ("--bwd-weight-us", bwd_weight_us), ("--p2p-us", p2p_us)):
        if v is not None and v < 0:
            raise InputError(flag, f"must not be negative (got {v})")
    if stages is not None and microbatches is not None:
        check_plan_size("--stages x --microbatches", stages * microbatches)
    if csv_path is not None and schedule is None:  # both given: load_schedule says that first
        check_input_file(csv_path, MAX_PLAN, "a schedule CSV")
    timing = ScheduleTiming(fwd_us, bwd_us, bwd_input_us, bwd_weight_us, p2p_us, p2p_bytes, eager_bytes)
    loaded = load_schedule(schedule, csv_path, stages, microbatches, ranks, timing, comm_model, defer_recv)
    if emit_csv:
        _write(emit_csv, lambda: dump_csv(loaded, emit_csv))
    if loaded.findings:
        click.echo(json.dumps(findings_json(loaded)) if fmt == "json" else findings_text(loaded))
        raise CheckFailed(1)
    _finish(loaded.program, fmt, emit_ir, chrome, png, emit_trace, trials, jitter, seed,
            header=_header(loaded.program), preface=loaded.preface(),
            extra={"valid": True, "torch_schedule": loaded.info()})


@sim_group.command("from-trace")
@click.argument("paths", nargs=-1, required=True)
@click.option("--streams", type=click.Choice(["per-group", "shared"]), default="per-group", show_default=True,
              help="A communication stream per process group (and per p2p peer), or one for all.")
@click.option("--eager-bytes", type=ByteSize(), default=None,
              help="Sends up to B bytes complete before their receive, larger ones wait for it [default: every "
                   "send buffered, as Gloo ran it].")
@click.option("--scale-pp", type=count("stages", 2, 4096), default=None,
              help="The recorded pipeline re-derived at K stages (its schedule, micro-batches and stage times).")
@_output_options
def from_trace_command(paths, streams, eager_bytes, scale_pp, fmt, emit_ir, chrome, png, emit_trace, trials,
                       jitter, seed) -> None:
    """Replay a recorded run (PATHS: `distdoctor run --dump-on-exit` dump directories, Flight Recorder dumps)
    in the simulator, with what-ifs: other streams, rendezvous sends, jittered timings, another pipeline degree.

    Exit code 1 when the replay deadlocks, 0 when it does not, 2 on bad input.
    """
    from distdoctor.diagnose.command import check_trace_inputs
    from distdoctor.sim.plans.from_trace import load_recorded, replay_program
    from distdoctor.trace.loaders import gc_paused

    check_trace_inputs(paths, True)
    source = "recorded run " + " ".join(paths)
    with gc_paused():  # the trace set stays alive: collection passes would rescan it while the program is built
        traces = load_recorded(list(paths))
        replay = replay_program(traces, streams, eager_bytes, source)
        del traces
    prog, tail = replay.program, lambda res: ({"from_trace": replay.info(res.state.makespan)},
                                              replay.sentence(res.state.makespan, res.deadlock))
    if scale_pp is not None:
        from distdoctor.sim.plans.trace_pipeline import rescale

        scaled = rescale(replay, scale_pp, eager_bytes)
        prog, tail = scaled.program, lambda res: ({"from_trace": {**replay.info(res.state.makespan),
                                                                  "scale_pp": scaled.info(res.state.makespan)}},
                                                  scaled.sentence(res.state.makespan, res.deadlock))
    _finish(prog, fmt, emit_ir, chrome, png, emit_trace, trials, jitter, seed, header=_header(prog),
            preface=replay.warning(), tail=tail, jitter_comm=True)


@sim_group.command("nccl")
@click.option("--tp", type=click.IntRange(1, 64), default=2, show_default=True, help="Tensor-parallel degree.")
@click.option("--pp", type=click.IntRange(2, 64), default=2, show_default=True, help="Pipeline stages.")
@click.option("--dp", type=click.IntRange(2, 1024), default=2, show_default=True, help="Data-parallel degree.")
@click.option("--ep", type=click.IntRange(1, 1024), default=2, show_default=True,
              help="Expert-parallel degree (divides --dp).")
@click.option("--steps", type=click.IntRange(1, 64), default=3, show_default=True, help="Training steps.")
@click.option("--micro", type=click.IntRange(1, 64), default=2, show_default=True, help="Micro-batches per step.")
@click.option("--fault", type=click.Choice(FR_FAULTS), default="healthy", show_default=True,
              help="What goes wrong (healthy: caught mid-flight).")
@click.option("--faulty", default="", help="The faulty ranks, comma-separated [default: drawn from --seed].")
@click.option("--at", type=Number("of the run", 0, 1, phrase="a fraction of the run (0 to 1)"), default=0.5,
              show_default=True, help="When the fault strikes, as a fraction of the run.")
@click.option("--full", is_flag=True, help="Dump the last entries (a ring), not only the active ones.")
@click.option("--missing-dump", is_flag=True, help="cpu_stall: the stuck ranks write no dump at all.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the GPUs' pacing (and --faulty).")
@click.option("--emit-trace", "emit_trace", type=click.Path(file_okay=False), required=True,
              help="Directory to write one Flight Recorder dump per rank into.")
@click.option("--trace-format", type=click.Choice(["fr-nccl", "fr-nccl-json"]), default="fr-nccl",
              show_default=True, help="Pickles (what TORCH_FR_DUMP_TEMP_FILE holds) or _dump_fr_trace_json's JSON.")
@click.option("--prefix", default="_dump_", show_default=True, help="File name prefix (the rank follows).")
@FORMAT_OPTION
def nccl_command(fmt, emit_trace, trace_format, prefix, faulty, seed, **kw) -> None:
    """An NCCL job's Flight Recorder dumps, simulated: CPUs run ahead, one GPU stream per group, planted faults."""
    from distdoctor.sim.fr_nccl import plan_from, write_set

    plan = plan_from(kw, faulty, seed)
    form = "json" if trace_format == "fr-nccl-json" else "pickle"
    got = []
    _write(emit_trace, lambda: got.append(write_set(emit_trace, plan, seed, form, prefix)))
    world = plan.tp * plan.pp * plan.dp
    if fmt == "json":
        click.echo(json.dumps({"world_size": world, "fault": plan.fault, "faulty": plan.faulty,
                               "hidden": got[0].hidden, "dir": emit_trace}))
    else:
        click.echo(f"{world} ranks, fault {plan.fault}" + (f" on ranks {plan.faulty}" if plan.faulty else "")
                   + f": dumps written to {emit_trace}")
    if plan.faulty:
        raise CheckFailed(1)


def _header(prog: Program) -> str:
    args = " ".join(a if " " not in a else repr(a) for a in sys.argv[1:])
    return f"{prog.source}\ngenerated by: distdoctor {args}"


@sim_group.command("examples")
@click.argument("name", required=False)
@click.option("--path", "show_path", is_flag=True, help="Print the example's file path instead of its text.")
def examples_command(name: str | None, show_path: bool) -> None:
    """List the shipped examples, or print one (run it with `distdoctor sim run NAME`)."""
    files = sorted(examples_dir().glob("*.yaml"))
    if name is None:
        for f in files:
            click.echo(f"{f.stem:<36} {_example_summary(f)}")
        return
    path = resolve_plan(name)
    click.echo(str(path.resolve()) if show_path else path.read_text(), nl=show_path)
