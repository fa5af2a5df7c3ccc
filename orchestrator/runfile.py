"""Run files, env files and flags in, a validated :class:`~manifests.spec.RunSpec` out.

The I/O half of building a spec (``manifests.spec`` is the pure half): YAML with duplicate
keys refused, env files, ``--env`` pairs and exit-code ranges, and the storage root
resolved once (``orchestrator.settings``). Every error is one line, exit 2.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

import yaml

from manifests.spec import RunSpec, build_spec
from orchestrator import settings
from xrun_contract.errors import XrunError, short_repr
from xrun_contract.storage import file_kind

MAX_EXIT_CODE = 255
# Run, nightly and env files are a few KB: past this they are refused before parsing (a
# manifest Kubernetes accepts is at most 1.5 MiB anyway: manifests.limits).
MAX_INPUT_BYTES = 1 << 20


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int):
        self.key, self.line = key, line


class _Alias(Exception):
    def __init__(self, anchor: Any, line: int):
        self.anchor, self.line = anchor, line


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML silently keeps the last of duplicate keys; a run file must not. Aliases
    (``*name``) are refused: nested ones expand exponentially (a "billion laughs" file of a
    few hundred bytes is a 9**9-element list), and no run or nightly key needs one."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise _Alias(event.anchor, event.start_mark.line + 1)
        return super().compose_node(parent, index)


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise _DuplicateKey(key, key_node.start_mark.line + 1)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


# Flow collections ([...] and {...}) nest at most this deep in a file we read. PyYAML's scanner
# is quadratic in the flow depth (each token revisits every open level's possible simple key):
# a 40 KB file of 20,000 nested brackets took 2.9 s of CPU to reach the RecursionError below
# (15 s on a loaded machine), and the whole file's tokens 36 s. No run or nightly key nests
# past a handful of levels.
MAX_FLOW_DEPTH = 100
_NOT_FLOW = re.compile(r"""'(?:[^']|'')*'|"(?:[^"\\]|\\.)*"|(?:^|(?<=\s))#[^\n]*|[^\[\]{}'"#]+""")


def flow_depth(text: str) -> int:
    """The deepest nesting of flow brackets in ``text``, quoted scalars and comments left out.
    An over-estimate where a plain scalar holds unbalanced brackets, which only matters past
    MAX_FLOW_DEPTH of them."""
    depth = deepest = 0
    for ch in _NOT_FLOW.sub("", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


def load_yaml_mapping(text: str, what: str, path: str) -> dict[str, Any]:
    """A YAML document that must be a mapping, with duplicate keys refused (``what`` names
    the file in errors: "run file", "nightly file")."""
    if flow_depth(text) > MAX_FLOW_DEPTH:
        raise XrunError(f"{what}: {path} is nested too deeply (over {MAX_FLOW_DEPTH} levels of [ and {{)")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as e:
        raise XrunError(f"{what}: duplicate key {short_repr(e.key)} (line {e.line})") from None
    except _Alias as e:
        raise XrunError(f"{what}: {path}: YAML aliases are not allowed (*{short_repr(e.anchor, 40)[1:-1]}, "
                        f"line {e.line}); write the value out") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise XrunError(f"{what}: {path} is not valid YAML{where}") from None
    except RecursionError:
        raise XrunError(f"{what}: {path} is nested too deeply") from None
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise XrunError(f"{what}: {path} holds a number too long to read (over 4,300 digits)") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise XrunError(f"{what}: {path} must be a YAML mapping, got {type(data).__name__}")
    return data


def read_text(path: str, what: str, limit: int = MAX_INPUT_BYTES) -> str:
    """A UTF-8 text file of at most ``limit`` bytes, or one line saying why it cannot be read.

    Opened without blocking and checked to be a regular file before a byte is read: a FIFO
    would block the open (no writer) or the read (no end), /dev/zero never ends."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise XrunError(f"{what}: cannot read {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = file_kind(st.st_mode)
            raise XrunError(f"{what}: {path} is {kind}, not a regular file" if kind.startswith("a ")
                            else f"{what}: {path} is not a regular file")
        if st.st_size > limit:
            raise XrunError(f"{what}: {path} is {st.st_size} bytes; at most {limit} (1 MiB) allowed")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise XrunError(f"{what}: cannot read {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew after the stat
        raise XrunError(f"{what}: {path} is over {limit} bytes; at most {limit} (1 MiB) allowed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise XrunError(f"{what}: {path} is not UTF-8 text") from None


def read_run_file(path: str) -> dict[str, Any]:
    return load_yaml_mapping(read_text(path, "run file"), "run file", path)


def parse_env_pairs(pairs: list[str], source: str = "--env") -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise XrunError(f"{source}: expected KEY=VALUE, got {short_repr(pair)}")
        if key in out:
            raise XrunError(f"{source}: duplicate env key {short_repr(key)}")
        out[key] = value
    return out


def parse_pairs(pairs: list[str], field: str) -> dict[str, str]:
    """--node-selector/--pod-labels/--pod-annotations KEY=VAL pairs (the run-file key named)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise XrunError(f"{field}: expected KEY=VALUE, got {short_repr(pair)}")
        if key in out:
            raise XrunError(f"{field}: duplicate key {short_repr(key)}")
        out[key] = value
    return out


def parse_toleration(text: str) -> dict[str, Any]:
    """kubectl's taint syntax: KEY=VALUE:EFFECT (Equal), KEY:EFFECT or KEY (Exists)."""
    head, sep, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, eq, value = head.partition("=")
    out: dict[str, Any] = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        out["value"] = value
    if sep:
        out["effect"] = effect
    return out


def parse_mount(text: str) -> dict[str, Any]:
    """gs://BUCKET:/PATH[:ro] or pvc:CLAIM:/PATH[:ro] -> a ``mounts`` entry."""
    body, read_only = (text[:-3], True) if text.endswith(":ro") else (text, False)
    if body.startswith("gs://"):
        source, sep, path = body[len("gs://"):].partition(":")
        entry: dict[str, Any] = {"bucket": source}
    elif body.startswith("pvc:"):
        source, sep, path = body[len("pvc:"):].partition(":")
        entry = {"pvc": source}
    else:
        raise XrunError("mounts: expected gs://BUCKET:/path or pvc:CLAIM:/path (':ro' for read-only), "
                        f"got {short_repr(text)}")
    if not sep:
        raise XrunError(f"mounts: {short_repr(text)} names no path (gs://BUCKET:/path)")
    return {**entry, "path": path, "read_only": read_only}


def read_env_file(path: str) -> dict[str, str]:
    lines = read_text(path, "--env-file").splitlines()
    pairs = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    pairs = [p.removeprefix("export ") for p in pairs]
    return parse_env_pairs(pairs, source=f"--env-file {path}")


def exit_codes(text: str) -> list[int]:
    """'42,127-255' -> the codes; every code must be 1..255 (checked before expanding)."""
    codes: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (not sep or hi.isdigit())):
            raise XrunError(f"restartable_exit_codes: {short_repr(part)} is not a code or range like 127-255")
        first, last = int(lo), int(hi) if sep else int(lo)
        if not 1 <= first <= last <= MAX_EXIT_CODE:
            raise XrunError(f"restartable_exit_codes: {short_repr(part)} must be codes or ranges within "
                            f"1..{MAX_EXIT_CODE}")
        codes.extend(range(first, last + 1))
    return codes


def spec_from_inputs(run_file: str | None, flags: dict[str, Any], *, env_file: str | None = None,
                     env_pairs: tuple[str, ...] | list[str] = (),
                     restartable_exit_codes: str | None = None,
                     base: dict[str, Any] | None = None) -> RunSpec:
    """Build and validate the RunSpec: file first, flags over it, the storage root resolved.
    ``base``: the values to start from when no run file is given (a resumed run's stored spec)."""
    file_values = read_run_file(run_file) if run_file else dict(base or {})
    env = read_env_file(env_file) if env_file else {}
    flag_env = parse_env_pairs(list(env_pairs))
    for key in flag_env:
        if key in env:
            raise XrunError(f"--env: duplicate env key {short_repr(key)} (also in --env-file)")
    env.update(flag_env)
    values = {k: v for k, v in flags.items() if v is not None}
    if restartable_exit_codes is not None:
        values["restartable_exit_codes"] = exit_codes(restartable_exit_codes)
    if env:
        values["env"] = env
    for source in (file_values, values):  # relative to the current folder, as XRUN_STORAGE is
        if isinstance(source.get("storage"), str):
            source["storage"] = settings.absolute_root(source["storage"])
    return build_spec(file_values, values, storage_default=settings.storage_root())
