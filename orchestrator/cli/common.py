"""What every command shares: output formats, kubectl-style tables, common options."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.table import Table

from orchestrator import settings
from orchestrator.services.runs import dump_yaml
from xrun_contract.storage import Storage

F = TypeVar("F", bound=Callable[..., Any])


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2, default=str) + "\n"
    return dump_yaml(obj)


def plain_table(*columns: str) -> Table:
    """kubectl-style table: no borders, bold headers."""
    table = Table(box=None, header_style="bold", show_edge=False)
    for col in columns:
        table.add_column(col)
    return table


def warn(message: str) -> None:
    click.echo(f"xrun: warning: {message}", err=True)


def info(message: str) -> None:
    click.echo(f"xrun: {message}", err=True)


def _set_timeout(_ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    settings.set_storage_timeout(value)


def storage_timeout_option(fn: F) -> F:
    """``--storage-timeout``: the deadline of each storage call, retries included (exit 3 past it)."""
    return click.option("--storage-timeout", metavar="SECONDS", expose_value=False,
                        callback=_set_timeout, is_eager=True,
                        help="Give up on unreachable storage after this long (exit 3). "
                        "Default: $XRUN_STORAGE_TIMEOUT or 30.")(fn)


def storage_option(fn: F) -> F:
    fn = storage_timeout_option(fn)
    return click.option("--storage", help="Storage root (folder or gs://bucket/prefix). "
                        "Default: $XRUN_STORAGE or ~/.local/share/xrun.")(fn)


def open_storage(root: str | None) -> Storage:
    return settings.open_root(root)


OUTPUT = click.option("-o", "--output", "fmt", type=click.Choice(["table", "json", "yaml"]),
                      default="table", show_default=True)
