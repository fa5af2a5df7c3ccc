"""The `xrun` command line (Click), in kubectl's manner.

Exit codes: 0 ok; 1 the run (or comparison) failed / regressed; 2 bad input (one line on
stderr naming the field, nothing submitted or written); 3 cluster or storage unreachable;
130 interrupted.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
import yaml

from orchestrator.spec import (
    RunSpec,
    SpecError,
    build_spec,
    parse_env_pairs,
    read_env_file,
    read_run_file,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class XrunError(click.ClickException):
    """A one-line error with an exit code (2 for bad input unless said otherwise)."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


class _ManifestDumper(yaml.SafeDumper):
    """Block style, except that lists of plain numbers (exit codes) stay on one line."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = bool(data) and all(isinstance(v, int) and not isinstance(v, bool) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_ManifestDumper.add_representer(list, _represent_list)


def dump_yaml(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_ManifestDumper, sort_keys=False, default_flow_style=False, width=100)


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2) + "\n"
    return dump_yaml(obj)


# ---------------------------------------------------------------------------------------
# Run spec options, shared by render and submit.

SPEC_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("-f", "--file", "run_file"), {"type": click.Path(dir_okay=False), "help": "YAML run file; flags override its keys."}),
    (("--name",), {"help": "Run (JobSet) name: a DNS-1035 label."}),
    (("--image",), {"help": "Workload container image."}),
    (("--command",), {"help": "Command run in every host (through /bin/sh -c). Default: python3 -m workload.train"}),
    (("--accelerator", "--tpu", "accelerator"), {"help": "Shape: v6e-1..v6e-256, v5litepod-N, v5p-N, v4-N, h100-80gb-8, h200-141gb-8, cpu-N."}),
    (("--num-slices",), {"type": int, "help": "TPU slices (multislice). Default 1."}),
    (("--nodes",), {"type": int, "help": "GPU nodes. Default 1."}),
    (("--cpu-devices-per-host",), {"type": int, "help": "CPU devices per host for cpu-N shapes. Default 2."}),
    (("--storage",), {"help": "Storage root: a folder or gs://bucket/prefix (env XRUN_STORAGE)."}),
    (("--env", "env_pairs"), {"multiple": True, "metavar": "KEY=VAL", "help": "Env var for every host (repeatable)."}),
    (("--env-file",), {"type": click.Path(dir_okay=False), "help": "File of KEY=VAL lines."}),
    (("--max-restarts",), {"type": int, "help": "JobSet failurePolicy.maxRestarts. Default 3."}),
    (("--restartable-exit-codes",), {"metavar": "CODES", "help": "Comma list of exit codes that restart the run (default 42,127-255)."}),
    (("--termination-grace-seconds",), {"type": int, "help": "Pod grace period. Default 120."}),
    (("--ttl-seconds-after-finished",), {"type": int, "help": "JobSet TTL. Default 86400."}),
    (("--service-account",), {"help": "Pod service account (Workload Identity for GCS)."}),
    (("--priority-class",), {"help": "Pod priorityClassName."}),
    (("--queue",), {"help": "Kueue LocalQueue name."}),
    (("--kueue-priority",), {"help": "Kueue WorkloadPriorityClass name."}),
    (("--privileged",), {"is_flag": True, "default": None, "help": "Run the container privileged."}),
    (("--branch",), {"help": "Branch the image was built from (for reports)."}),
    (("--commit",), {"help": "Commit the image was built from (for reports)."}),
    (("--backend",), {"type": click.Choice(["local", "kube"]), "help": "Default: kube when a --context is named, else local."}),
    (("--context",), {"help": "kubeconfig context (selects the GKE backend)."}),
    (("-n", "--namespace"), {"help": "Kubernetes namespace. Default 'default'."}),
]


def spec_options(fn):
    for decls, kwargs in reversed(SPEC_OPTIONS):
        fn = click.option(*decls, **kwargs)(fn)
    return fn


def _exit_codes(text: str) -> list[int]:
    codes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (not sep or hi.isdigit())):
            raise SpecError(f"restartable_exit_codes: {part!r} is not a code or range like 127-255")
        codes.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return codes


def spec_from_options(opts: dict[str, Any]) -> RunSpec:
    """Build and validate the RunSpec from a command's options (file first, flags over it)."""
    opts = dict(opts)
    run_file = opts.pop("run_file", None)
    file_values = read_run_file(run_file) if run_file else {}
    env = read_env_file(opts.pop("env_file")) if opts.get("env_file") else {}
    opts.pop("env_file", None)
    flag_env = parse_env_pairs(list(opts.pop("env_pairs", ()) or ()))
    for key in flag_env:
        if key in env:
            raise SpecError(f"--env: duplicate env key {key!r} (also in --env-file)")
    env.update(flag_env)
    codes = opts.pop("restartable_exit_codes", None)
    flags = {k: v for k, v in opts.items() if v is not None}
    if codes is not None:
        flags["restartable_exit_codes"] = _exit_codes(codes)
    if env:
        flags["env"] = env
    return build_spec(file_values, flags)


def render_manifest(spec: RunSpec) -> dict[str, Any]:
    from manifests.jobset import jobset

    return jobset(spec)


# ---------------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="xrun")
def cli() -> None:
    """xrun: run multi-host JAX training on GKE TPU slices (JobSet), or locally.

    \b
    Examples:
      xrun submit -f examples/local-tiny.yaml            # 2 local hosts, trains, follows
      xrun render --name mt-07 --tpu v6e-32 --num-slices 2 --image IMG > jobset.yaml
      xrun submit -f run.yaml --context gke_proj_zone_cluster -n team
      xrun logs mt-07 -f
      xrun status mt-07 -o json
    """


@cli.command()
@spec_options
@click.option("-o", "--output", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True)
@click.option("--output-file", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
def render(fmt: str, output_file: str | None, **opts: Any) -> None:
    """Print the JobSet manifest of a run spec (nothing is submitted).

    \b
    Examples:
      xrun render --name mt-07-eval --tpu v6e-32 --num-slices 2 --image IMG \\
                  --command "python3 -m workload.train --preset 1b"
      xrun render -f run.yaml -o json --output-file jobset.json
      xrun render -f run.yaml | kubectl apply -f -
    """
    spec = spec_from_options(opts)
    text = dump(render_manifest(spec), fmt)
    if output_file:
        with open(output_file, "w") as f:
            f.write(text)
    else:
        click.echo(text, nl=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every error is one line on stderr with a meaningful exit code."""
    try:
        rv = cli.main(args=argv, prog_name="xrun", standalone_mode=False)
        return rv if isinstance(rv, int) else EXIT_OK
    except SpecError as e:
        click.echo(f"xrun: error: {e}", err=True)
        return EXIT_USAGE
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


if __name__ == "__main__":
    sys.exit(main())
