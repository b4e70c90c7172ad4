"""The `distdoctor` command line. Subcommands only parse arguments and call the modules that do the work.

Each subcommand lives beside the code it drives and is imported only when used, so `distdoctor sim` or
`distdoctor diagnose` never pays for importing torch.distributed, and a broken optional module cannot break
the others. Exit codes: 0 all good, 1 what was checked failed, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import importlib
import sys

import click

from distdoctor import __version__
from distdoctor.errors import CheckFailed, InputError

# name -> ("module:attribute" of a click.Command, one-line help). The module owns the command; the help is
# here so that `distdoctor --help` lists everything without importing torch.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "check": ("distdoctor.validate.check:check_command", "The main job: environment, quick validate and quick bench, one verdict."),
    "env": ("distdoctor.world.env:env_command", "Torch version, backends, devices and the mode distdoctor will use."),
    "validate": ("distdoctor.validate.command:validate_command", "Check every collective's result against an exact reference."),
    "bench": ("distdoctor.bench.command:bench_command", "Collective bandwidth with nccl-tests' algbw/busbw semantics."),
    "diagnose": ("distdoctor.diagnose.command:diagnose_command", "Explain a hang or desync from per-rank traces."),
    "lint": ("distdoctor.lint.command:lint_command", "Latent deadlock hazards in the dumps of a run that did not hang."),
    "run": ("distdoctor.recorder.command:run_command", "Run a training command with the distdoctor recorder on."),
    "watch": ("distdoctor.diagnose.watch_command:watch_command", "Watch a running job through its store; a verdict when it hangs."),
    "sim": ("distdoctor.sim.command:sim_group", "Simulate a parallel plan: deadlocks, bubbles, needless waits."),
    "scaling": ("distdoctor.health.scaling:scaling_command", "Measured and projected data-parallel scaling efficiency."),
    "parity": ("distdoctor.health.parity:parity_command", "Data-parallel training gives the same parameters as one process."),
}

FORMAT_OPTION = click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one JSON document on stdout and nothing else there.",
)


def write_document(text: str) -> None:
    """Write a whole report (one JSON document) to stdout and flush it at once: under a launcher (mpirun, srun) a
    rank may be stopped the moment another ends, and a document left in the buffer would come out cut at 8 KiB."""
    out = sys.stdout
    out.write(text if text.endswith("\n") else text + "\n")
    out.flush()


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module_name, attr = SUBCOMMANDS[name][0].split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("distdoctor"):
                raise InputError(name, "this subcommand is not available in this build") from exc
            raise
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUBCOMMANDS[name][1]) for name in SUBCOMMANDS])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="distdoctor")
def cli() -> None:
    """Validate, diagnose, simulate and monitor distributed PyTorch training."""


# click >= 8.2 raises this (a UsageError) for a group called without a subcommand; older click prints the help.
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _fail(prog: str, message: str, code: int = 2) -> None:
    # One line whatever the input held: control characters from an argument (\r, \x00) are shown escaped.
    message = "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    sub = next((a for a in args if not a.startswith("-")), None)
    prog = f"distdoctor {sub}" if sub in SUBCOMMANDS else "distdoctor"
    # No process's argv holds a NUL byte, but main() called in-process may get one, and every path option
    # would fail on it inside click (os.stat raises ValueError, not OSError): refused here, once for all.
    nul = next((a for a in args if "\x00" in a), None)
    if nul is not None:
        _fail(prog, f"argument {nul!r} holds a NUL byte")
    try:
        rv = cli.main(args=args, prog_name="distdoctor", standalone_mode=False)
    except _NO_ARGS_IS_HELP as exc:
        # `distdoctor` or `distdoctor sim` alone: the help, as --help prints it (click >= 8.2 raises this).
        click.echo(exc.ctx.get_help())
        sys.exit(0)
    except InputError as exc:
        _fail(prog, str(exc))
    except CheckFailed as exc:
        sys.exit(exc.code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        _fail(prog, "interrupted", 130)
    except click.UsageError as exc:
        # click's own message already names the option and the reason; keep it to one line.
        _fail(prog, exc.format_message().replace("\n", " "))
    except click.ClickException as exc:
        _fail(prog, exc.format_message().replace("\n", " "), exc.exit_code)
    except KeyboardInterrupt:
        _fail(prog, "interrupted", 130)
    else:
        sys.exit(rv if isinstance(rv, int) else 0)
