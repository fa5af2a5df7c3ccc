"""The `xrun` command line (Click), in kubectl's manner: thin, it parses, calls a service
(``orchestrator.services``) and prints.

Exit codes (``xrun_contract.errors``): 0 ok; 1 the run (or comparison) failed / regressed;
2 bad input (one line on stderr naming the field, nothing submitted or written); 3 cluster
or storage unreachable; 130 interrupted.
"""

from __future__ import annotations

import importlib

import click

from orchestrator.cli import runs
from xrun_contract.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, XrunError

# Commands whose module is imported only when one of them runs (or help lists them): the
# analysis and doctor modules' imports are a tenth of a second of every ``xrun status``.
LAZY_COMMANDS = {name: "orchestrator.cli.analysis" for name in ("compare", "report", "nightly", "history")}
LAZY_COMMANDS["doctor"] = "orchestrator.cli.cluster"


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            for command in importlib.import_module(LAZY_COMMANDS[cmd_name]).COMMANDS:
                self.add_command(command)
        return self.commands.get(cmd_name)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 80})
@click.version_option(package_name="xrun")
def cli() -> None:
    """xrun: run multi-host JAX training on GKE TPU slices (JobSet), or locally.

    \b
    Examples:
      xrun submit -f examples/local-tiny.yaml   # 2 local hosts, trains, follows
      xrun render --name mt-07 --tpu v6e-32 --num-slices 2 --image IMG > js.yaml
      xrun submit -f run.yaml --context gke_proj_zone_cluster -n team
      xrun logs mt-07 -f
      xrun status mt-07 -o json
    """


for _command in runs.COMMANDS:
    cli.add_command(_command)


def _on_terminal(line: str) -> str:
    """An error line as a terminal shows it: folded to its width with the continuation
    indented (a 400-character refusal wrapped at column 0 is hard to read); piped or
    captured it stays one line, for scripts and logs."""
    import shutil
    import sys
    import textwrap

    if not sys.stderr.isatty():
        return line
    width = shutil.get_terminal_size().columns
    if len(line) <= width:
        return line
    return "\n".join(textwrap.wrap(line, width, subsequent_indent="    ", break_on_hyphens=False)) or line


def main(argv: list[str] | None = None) -> int:
    """Entry point: every error is one line on stderr with a meaningful exit code."""
    try:
        rv = cli.main(args=argv, prog_name="xrun", standalone_mode=False)
        return rv if isinstance(rv, int) else EXIT_OK
    except XrunError as e:
        click.echo(_on_terminal(f"xrun: error: {e}"), err=True)
        return e.exit_code
    except click.exceptions.NoArgsIsHelpError as e:
        click.echo(e.ctx.get_help() if e.ctx else str(e), err=True)
        return EXIT_USAGE
    except click.UsageError as e:
        msg = e.format_message().replace("\n", " ")
        hint = f" (see '{e.ctx.command_path} --help')" if e.ctx else ""
        click.echo(f"xrun: error: {msg}{hint}", err=True)
        return EXIT_USAGE
    except click.ClickException as e:
        click.echo(f"xrun: error: {e.format_message()}", err=True)
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except (click.Abort, KeyboardInterrupt):
        click.echo("xrun: interrupted", err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
