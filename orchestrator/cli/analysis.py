"""`xrun compare`, `xrun report`, `xrun nightly`: parse, call a service, print.

Exit codes as the rest of xrun: 0 nothing regressed; 1 a significant regression beyond the
threshold (or a failed candidate), so a scheduler can alert; 2 bad input (one line naming
the field, nothing written); 3 storage or cluster unreachable; 4 not comparable (the runs
ran on different shapes: accelerator, devices or hosts; the table is shown, no verdict).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import click

from orchestrator import settings
from orchestrator.cli.common import storage_timeout_option
from orchestrator.services import analysis
from xrun_contract.errors import EXIT_FAILED, EXIT_NOT_COMPARABLE, EXIT_OK, XrunError


class Percent(click.ParamType):
    """'5%', '5' or '2.5%': a percentage in 0..1000."""

    name = "percent"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%?\s*", str(value))
        if not m or float(m[1]) > 1000:
            self.fail(f"{value!r} is not a percentage; use e.g. 5% or 2.5 (0 to 1000)", param, ctx)
        return float(m[1])


def _check_output(path: str | None) -> None:
    """Refuse an output path we could not write before doing any work (the folder must
    exist, be a folder and be writable as far as access(2) knows; what it cannot know, e.g.
    /proc or /sys as root, :func:`_write` reports the same way). Nothing is created here."""
    if path is None or path == "-":
        return
    p = Path(path)
    if p.is_dir():
        raise XrunError(f"--output: {path} is a folder; give a file name")
    if not p.parent.exists():
        raise XrunError(f"--output: folder {p.parent} does not exist")
    if not p.parent.is_dir():
        raise XrunError(f"--output: {p.parent} is not a folder, so {path} cannot be written")
    if not os.access(p.parent, os.W_OK | os.X_OK):
        raise XrunError(f"--output: cannot write {path}: Permission denied")


def _tmp_name(p: Path) -> Path:
    return p.with_name(f".{p.name}.tmp-{os.getpid()}")


def _write(text: str, path: str | None) -> None:
    if path is None or path == "-":
        click.echo(text, nl=False)
        return
    p = Path(path)
    tmp = _tmp_name(p)
    try:
        tmp.write_text(text)
        os.replace(tmp, p)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise XrunError(f"--output: cannot write {path}: {e.strerror or e}") from None
    click.echo(f"xrun: wrote {p}", err=True)


def _common(fn):
    for deco in reversed([
        click.option("--storage", help="Storage root for run names (folder or gs://bucket/prefix). "
                                       "Default: $XRUN_STORAGE or ~/.local/share/xrun."),
        click.option("--threshold", type=Percent(), default="5%", show_default=True,
                     help="Smallest significant regression that sets exit code 1."),
        click.option("--alpha", type=click.FloatRange(0.0001, 0.5), default=0.05, show_default=True,
                     help="Significance level of the Mann-Whitney U test."),
        click.option("--warmup", type=click.IntRange(0, 10_000), default=3, show_default=True,
                     help="Steps of each attempt left out of steady state (compilation, restore)."),
        click.option("--peak-tflops", type=click.FloatRange(0, None, min_open=True), default=None,
                     help="Per-device peak TFLOP/s: a step over it is impossible (an outlier). "
                     "Default: the accelerator's catalogue figure, where the run names one."),
    ]):
        fn = deco(fn)
    return storage_timeout_option(fn)


@click.command()
@click.argument("base")
@click.argument("candidate")
@_common
@click.option("--format", "fmt", type=click.Choice(["table", "md", "json", "html"]), default=None,
              help="table (aligned, coloured: the default on a terminal), md (the default otherwise), json, html.")
@click.option("-o", "--output", help="Write to this file instead of stdout.")
@click.option("--label-a", help="BASE's branch@commit (e.g. main@574ad3fb9), branch, or @commit: "
              "names the column and feeds the same-commit warning.")
@click.option("--label-b", help="CANDIDATE's branch@commit, branch, or @commit.")
def compare(base: str, candidate: str, storage: str | None, threshold: float, alpha: float,
            warmup: int, peak_tflops: float | None, fmt: str, output: str | None, label_a: str | None,
            label_b: str | None) -> int:
    """Compare CANDIDATE with BASE: a table, significance marks, warnings, goodput.

    BASE and CANDIDATE are each a run name (under --storage), a run path
    (<root>/runs/<name>, local or gs://) or a log / metrics file (MaxText or xrun lines;
    .gz too). Exit code: 0 no significant regression beyond --threshold, 1 regression (or
    the candidate failed), 2 bad input, 4 not comparable (different accelerator, device or
    host counts: the table is shown, no verdict).

    \b
    Examples:
      xrun compare nightly-main-20250103-030000-0 nightly-feat-x-20250103-030000-1
      xrun compare main.log feat.log --threshold 3% --format json
      xrun compare main.log feat.log --label-a main@574ad3fb9 \\
          --label-b feat/x@def456
      xrun compare gs://b/xrun/runs/a gs://b/xrun/runs/b --format html -o cmp.html
    """
    _check_output(output)
    result = analysis.compare(base, candidate, settings.storage_root(storage),
                              threshold_pct=threshold, alpha=alpha, warmup=warmup,
                              label_a=label_a, label_b=label_b, peak_tflops=peak_tflops)
    if fmt is None:
        to_terminal = (output is None or output == "-") and click.get_text_stream("stdout").isatty()
        fmt = "table" if to_terminal else "md"
    if fmt == "table":
        from rich.console import Console

        from orchestrator.cli.screen import comparison_screen

        if output is None or output == "-":
            console = Console()
            if not console.is_terminal:  # piped: every line whole
                Console(soft_wrap=True, width=4000).print(comparison_screen(result))
                return result.exit_code
            console.print(comparison_screen(result, width=console.width))
            return result.exit_code
        console = Console(record=True, width=160, file=open(os.devnull, "w"))  # noqa: SIM115
        console.print(comparison_screen(result))
        text = console.export_text()
    elif fmt == "json":
        text = result.json()
    elif fmt == "html":
        text = analysis.comparison_html(result)
    else:
        text = result.markdown()
    _write(text, output)
    if output not in (None, "-") and result.exit_code:
        _why_failed([result])
    return result.exit_code


def _exit_code(results: list[Any]) -> int:
    """1 when any comparison regressed, else 4 when any pair ran on different shapes."""
    if any(r.regressed for r in results):
        return EXIT_FAILED
    return EXIT_NOT_COMPARABLE if any(r.not_comparable for r in results) else EXIT_OK


def _why_failed(results: list[Any]) -> None:
    """Why the exit code is 1, on stderr, when the page went to a file (not only inside it)."""
    from orchestrator.cli.screen import verdict_line

    for r in results:
        if r.regressed or r.not_comparable:
            click.echo(f"xrun: {r.cand_label} vs {r.base_label}: {verdict_line(r).plain}", err=True)


@click.command()
@click.argument("base")
@click.argument("candidates", nargs=-1, metavar="[CANDIDATE...]")
@_common
@click.option("-o", "--output", default="xrun-report.html", show_default=True,
              help="HTML file to write ('-' for stdout).")
@click.option("--title", default=None, help="Default: 'xrun comparison report', or 'xrun run report' for one run.")
def report(base: str, candidates: tuple[str, ...], storage: str | None, threshold: float, alpha: float,
           warmup: int, peak_tflops: float | None, output: str, title: str | None) -> int:
    """Write a self-contained HTML report: tables, interactive loss and step-time charts, goodput.

    Every CANDIDATE is compared with BASE; with no CANDIDATE, a single-run report of BASE.
    Exit code as `xrun compare`: 1 when any candidate regressed, 2 bad input (nothing written).

    \b
    Examples:
      xrun report main-run feat-a-run feat-b-run -o report.html
      xrun report main.log feat.log.gz -o - > report.html
      xrun report my-run -o my-run.html
    """
    _check_output(output)
    title = title or ("xrun comparison report" if candidates else f"xrun run report: {base}")
    page, results = analysis.report(base, candidates, settings.storage_root(storage),
                                    threshold_pct=threshold, alpha=alpha, warmup=warmup, title=title,
                                    peak_tflops=peak_tflops)
    _write(page, output)
    code = _exit_code(results)
    if code and output != "-":
        _why_failed(results)
    return code


@click.command()
@click.option("-f", "--file", "nightly_file", required=True, type=click.Path(dir_okay=False),
              help="The nightly file: base branch, candidate branches, configs, slice, storage, schedule.")
@click.option("--render-cronjob", is_flag=True,
              help="Print the CronJob, ServiceAccount, Role, RoleBinding (and ConfigMap) as YAML; run nothing.")
@click.option("--dry-run", is_flag=True, help="Print the run files that would be submitted; run nothing.")
@click.option("--storage", help="Override the file's storage root.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(1, None),
              help="Per-run time limit in seconds (overrides the file).")
@click.option("--repo", type=click.Path(file_okay=False),
              help="Override the file's repo: (a git checkout the branches are built from).")
def nightly(nightly_file: str, render_cronjob: bool, dry_run: bool, storage: str | None,
            timeout_s: float | None, repo: str | None) -> int:
    """Run every (branch, config) on the same slice, compare each candidate with the base.

    Runs are named <prefix>-<branch>-<YYYYmmdd-HHMMSS>-<i> and run one after another.
    Each config's `repeats` runs per branch are interleaved (A B A B ...); with >= 4 runs a
    side the verdict rests on per-run figures. Appends history/<nightly>.jsonl and writes
    reports/<YYYY-mm-dd-HHMMSS>/summary.md, summary.json and index.html under the storage
    root. Exit code: 0 within noise, 1 a regression, an INCOMPLETE comparison or a failed
    run, 2 bad nightly file, 3 storage or cluster unreachable.

    \b
    Examples:
      xrun nightly -f nightly.yaml
      xrun nightly -f nightly.yaml --render-cronjob | kubectl apply -f -
    """
    from orchestrator.nightly_file import load_nightly
    from orchestrator.services.nightly import render_cronjob_yaml, run_nightly

    cfg = load_nightly(nightly_file)
    if repo:
        import dataclasses
        import os

        if not cfg.repo:
            raise XrunError("--repo: the nightly file has no repo: key (its branches name prebuilt images)")
        cfg = dataclasses.replace(cfg, repo=os.path.abspath(repo))
    if storage:
        cfg = cfg.with_storage(storage)
    if timeout_s:
        cfg.timeout_s = timeout_s
    if render_cronjob:
        click.echo(render_cronjob_yaml(cfg, cfg.text), nl=False)
        return EXIT_OK
    if dry_run:
        import dataclasses

        import yaml

        from orchestrator.nightly_file import plan_runs
        from orchestrator.services.nightly import resolve_branches

        if cfg.repo:  # the commits each branch would run now (no worktree is made)
            commits = resolve_branches(cfg)
            cfg = dataclasses.replace(cfg, branches=[dataclasses.replace(b, commit=commits[b.name])
                                                     for b in cfg.branches])
        for run in plan_runs(cfg):
            click.echo("---")
            click.echo(yaml.safe_dump(run.run_file, sort_keys=False), nl=False)
        return EXIT_OK
    from rich.console import Console

    from orchestrator.cli.progress import ProgressScreen

    console = Console(stderr=True)
    with ProgressScreen(console, interval=30.0) as screen:
        def show(index: int, total: int, view: dict[str, Any]) -> None:
            screen.update({**view, "name": f"[{index}/{total}] {view['name']}"})

        result = run_nightly(cfg, log=lambda msg: screen.note(msg), on_view=show)
    click.echo(_for_terminal(result.summary_md), nl=False)
    click.echo(f"xrun: report {result.report_url}", err=True)
    pairs = [(e["base_runs"][0], e["runs"][0]) for e in result.summary.get("comparisons", [])
             if e.get("base_runs") and e.get("runs")]
    if pairs:  # the runs are under the nightly's root, which need not be the default one
        click.echo(f"xrun: one pair in detail: xrun compare {pairs[0][0]} {pairs[0][1]} "
                   f"--storage {_shown_root(cfg.storage)}", err=True)
    return result.exit_code


def _for_terminal(md: str) -> str:
    """The nightly's markdown as a terminal shows it: its prose folded to the width, indented
    under its own line (a note was one 414-column line); table rows as they are (a row cut
    apart no longer reads as one) and the last line, the verdict CI reads, whole. Piped: as
    written to summary.md."""
    import shutil
    import sys

    from orchestrator.cli.screen import fold

    if not sys.stdout.isatty():
        return md
    width = shutil.get_terminal_size().columns
    lines = md.split("\n")
    last = max((i for i, ln in enumerate(lines) if ln.strip()), default=-1)
    return "\n".join(ln if i == last or ln.startswith("|") else fold(ln, width) for i, ln in enumerate(lines))


def _shown_root(root: str) -> str:
    """A local root under the current folder as ./relative (what a user would type)."""
    if root.startswith("gs://") or not os.path.isabs(root):
        return root
    rel = os.path.relpath(root)
    return root if rel.startswith("..") else "./" + rel if rel != "." else "."


@click.command()
@click.option("--storage", help="Storage root the nightlies wrote to. Default: $XRUN_STORAGE or ~/.local/share/xrun.")
@click.option("--branch", default="main", show_default=True, help="Branch whose nights to show.")
@click.option("--metric", default="steady_s_per_step", show_default=True,
              help="A per-run figure: steady_s_per_step, tokens_per_s, tflops_per_device, avg_s_per_step, "
                   "final_loss, checkpoint_stall_s, time_to_first_step_s, goodput_pct.")
@click.option("--config", help="Only this nightly config (default: each config in turn).")
@click.option("--last", type=click.IntRange(1, 10_000), default=30, show_default=True, help="Nights to show.")
@click.option("--threshold", type=Percent(), default="5%", show_default=True,
              help="Smallest step change between nights reported as a change point.")
@click.option("--alpha", type=click.FloatRange(0.0001, 0.5), default=0.05, show_default=True)
def history(storage: str | None, branch: str, metric: str, config: str | None, last: int,
            threshold: float, alpha: float) -> int:
    """Print a branch's trend over nights and the change points in it.

    One line per nightly (its runs' median, min, max of --metric); a change point is a step
    change beyond noise between nights (Mann-Whitney on the runs either side), named by the
    night and the commits that bracket it. Exit code 0; 2 bad input; 3 storage unreachable.

    \b
    Examples:
      xrun history --branch main --metric steady_s_per_step
      xrun history --storage gs://b/xrun --metric tokens_per_s --last 60
    """
    text, _cps = analysis.history(settings.storage_root(storage), branch=branch, metric=metric,
                                  config=config, last=last, alpha=alpha, threshold_pct=threshold)
    click.echo(text, nl=False)
    return EXIT_OK


COMMANDS = (compare, report, nightly, history)
