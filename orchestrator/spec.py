"""RunSpec: a run's whole description, validated once, with every default in one place.

A spec comes from a YAML run file and/or CLI flags (flags override the file). Everything
downstream (manifests, backends, readers) trusts a RunSpec and never re-validates.
Errors are ``SpecError``: one line naming the field and what is allowed.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from manifests import catalogue
from xrun_contract import RESTARTABLE_EXIT_CODE, Env


class SpecError(ValueError):
    """Bad input: the message is one line naming the field and what is allowed."""


DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
POD_SUFFIX = 6  # "-xxxxx": the random suffix Kubernetes adds to a Job's pod names
MAX_LABEL = 63
# Exit codes that mean "preempted / restart me" (xpk's convention): 42 and 127-255.
DEFAULT_RESTARTABLE_EXIT_CODES = (RESTARTABLE_EXIT_CODE, *range(127, 256))


def default_storage() -> str:
    """Where runs live without --storage/XRUN_STORAGE: a per-user local folder."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "xrun")


@dataclass
class RunSpec:
    name: str = ""
    image: str = ""
    command: str = "python3 -m workload.train"
    accelerator: str = ""  # a catalogue shape (v6e-32, h200-141gb-8) or cpu-N
    num_slices: int = 1  # TPU multislice
    nodes: int = 1  # GPU nodes
    cpu_devices_per_host: int = 2  # cpu-N shapes only
    storage: str = ""  # local folder or gs://bucket/prefix; "" -> XRUN_STORAGE or default
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 3
    restartable_exit_codes: list[int] = field(
        default_factory=lambda: list(DEFAULT_RESTARTABLE_EXIT_CODES)
    )
    termination_grace_seconds: int = 120
    ttl_seconds_after_finished: int = 86400
    service_account: str = ""  # Workload Identity for GCS; omitted when empty
    priority_class: str = ""  # pod priorityClassName
    queue: str = ""  # Kueue LocalQueue (label kueue.x-k8s.io/queue-name)
    kueue_priority: str = ""  # label kueue.x-k8s.io/priority-class
    privileged: bool = False
    coordinator_port: int = 8476  # jax.distributed coordinator on process 0
    megascale_port: int = 8080
    branch: str = ""  # for reports: which branch the image was built from
    commit: str = ""
    # Where to submit: "" (local unless a context is named), "local" or "kube".
    backend: str = ""
    context: str = ""  # kubeconfig context
    namespace: str = "default"

    # --- derived -----------------------------------------------------------------
    @property
    def shape(self) -> catalogue.Shape:
        return catalogue.lookup(self.accelerator, self.cpu_devices_per_host)

    @property
    def hosts_per_slice(self) -> int:
        s = self.shape
        return self.nodes if s.kind == "gpu" else s.vms

    @property
    def slices(self) -> int:
        return self.num_slices if self.shape.kind == "tpu" else 1

    @property
    def storage_root(self) -> str:
        return self.storage or os.environ.get(Env.STORAGE) or default_storage()

    @property
    def backend_name(self) -> str:
        return self.backend or ("kube" if self.context else "local")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = {f.name: f for f in fields(RunSpec)}


# ---------------------------------------------------------------------------------------
# Loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML silently keeps the last of duplicate keys; a run file must not."""


def _construct_mapping(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise SpecError(f"run file: duplicate key {key!r} (line {key_node.start_mark.line + 1})")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def read_run_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise SpecError(f"run file: cannot read {path}: {e.strerror}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise SpecError(f"run file: {path} is not valid YAML{where}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"run file: {path} must be a YAML mapping of run fields, got {type(data).__name__}")
    return data


def parse_env_pairs(pairs: list[str], source: str = "--env") -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SpecError(f"{source}: expected KEY=VALUE, got {pair!r}")
        if key in out:
            raise SpecError(f"{source}: duplicate env key {key!r}")
        out[key] = value
    return out


def read_env_file(path: str) -> dict[str, str]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise SpecError(f"--env-file: cannot read {path}: {e.strerror}") from None
    pairs = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    pairs = [p.removeprefix("export ") for p in pairs]
    return parse_env_pairs(pairs, source=f"--env-file {path}")


def env_values(mapping: dict[Any, Any], where: str) -> dict[str, str]:
    """An env mapping as strings (YAML true -> "true"); nested values are refused."""
    out = {}
    for k, v in mapping.items():
        if isinstance(v, dict | list) or v is None:
            raise SpecError(f"{where}.{k}: must be a string, number or bool")
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _coerce(name: str, value: Any) -> Any:
    """Type-check one field's value against the dataclass annotation."""
    kind = FIELDS[name].type
    if kind == "bool":
        if not isinstance(value, bool):
            raise SpecError(f"{name}: must be true or false, got {value!r}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
                return int(value)
            raise SpecError(f"{name}: must be an integer, got {value!r}")
        return value
    if kind == "str":
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise SpecError(f"{name}: must be a string, got {type(value).__name__}")
        return str(value)
    if kind == "dict[str, str]":
        if not isinstance(value, dict):
            raise SpecError(f"{name}: must be a mapping of NAME: value")
        return env_values(value, name)
    if kind == "list[int]":
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise SpecError(f"{name}: must be a list of integers")
        return list(value)
    raise AssertionError(kind)


def build_spec(file_values: dict[str, Any], flag_values: dict[str, Any]) -> RunSpec:
    """Merge run-file values and CLI flags (flags win; env maps merge, flags win per key)."""
    unknown = sorted(set(file_values) - set(FIELDS))
    if unknown:
        raise SpecError(
            f"run file: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(FIELDS))}"
        )
    merged: dict[str, Any] = {}
    for name, value in file_values.items():
        if value is None:
            raise SpecError(f"{name}: empty value in run file; remove the key or give a value")
        merged[name] = _coerce(name, value)
    for name, value in flag_values.items():
        if value is None:
            continue
        if name == "env":
            merged["env"] = {**merged.get("env", {}), **value}
        else:
            merged[name] = _coerce(name, value)
    spec = RunSpec(**merged)
    validate(spec)
    return spec


def max_name_length(spec: RunSpec) -> int:
    """Longest JobSet name whose pod names <name>-slice-<j>-<p>-xxxxx fit in 63 characters."""
    j = len(str(spec.slices - 1))
    p = len(str(spec.hosts_per_slice - 1))
    return MAX_LABEL - len("-slice-") - j - 1 - p - POD_SUFFIX


def validate(spec: RunSpec) -> None:
    if not spec.name:
        raise SpecError("name: required (a DNS-1035 label: lowercase letters, digits, '-')")
    if not DNS1035.match(spec.name):
        raise SpecError(
            f"name: {spec.name!r} is not a DNS-1035 label (lowercase letters, digits and '-', "
            "starting with a letter, ending with a letter or digit)"
        )
    if not spec.accelerator:
        raise SpecError("accelerator: required (e.g. v6e-8, v6e-32, h200-141gb-8, cpu-2)")
    try:
        shape = spec.shape
    except catalogue.UnknownAccelerator as e:
        raise SpecError(f"accelerator: {e}") from None
    if spec.num_slices < 1:
        raise SpecError(f"num_slices: must be >= 1, got {spec.num_slices}")
    if spec.num_slices > 1 and shape.kind != "tpu":
        raise SpecError(f"num_slices: multislice is for TPU shapes only, not {spec.accelerator}")
    if spec.nodes < 1:
        raise SpecError(f"nodes: must be >= 1, got {spec.nodes}")
    if spec.nodes > 1 and shape.kind != "gpu":
        raise SpecError(f"nodes: only for GPU shapes; {spec.accelerator} has a fixed host count")
    if not 1 <= spec.cpu_devices_per_host <= 64:
        raise SpecError(f"cpu_devices_per_host: must be 1..64, got {spec.cpu_devices_per_host}")
    limit = max_name_length(spec)
    if len(spec.name) > limit:
        raise SpecError(
            f"name: {spec.name!r} is {len(spec.name)} characters; at most {limit} for "
            f"{spec.slices} slice(s) x {spec.hosts_per_slice} hosts, so pod names "
            "<name>-slice-<j>-<p>-xxxxx stay within 63"
        )
    if not spec.image.strip():
        raise SpecError("image: required (the workload container image, e.g. us-docker.pkg.dev/p/r/xrun:tag)")
    if any(c.isspace() for c in spec.image):
        raise SpecError(f"image: must not contain whitespace, got {spec.image!r}")
    if not spec.command.strip():
        raise SpecError("command: must not be empty (default: python3 -m workload.train)")
    try:
        shlex.split(spec.command)
    except ValueError as e:
        raise SpecError(f"command: cannot be parsed as a shell command: {e}") from None
    reserved = Env.all_names()
    for key, value in spec.env.items():
        if not ENV_NAME.match(key):
            raise SpecError(f"env: {key!r} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if key in reserved and not key.startswith("XRUN_TEST_"):
            raise SpecError(f"env: {key} is set by xrun itself; choose another name")
        if "\x00" in value:
            raise SpecError(f"env: value of {key} contains a NUL byte")
    if spec.max_restarts < 0:
        raise SpecError(f"max_restarts: must be >= 0, got {spec.max_restarts}")
    if not spec.restartable_exit_codes or not all(
        1 <= c <= 255 for c in spec.restartable_exit_codes
    ):
        raise SpecError("restartable_exit_codes: must be a non-empty list of codes in 1..255")
    if len(set(spec.restartable_exit_codes)) != len(spec.restartable_exit_codes):
        raise SpecError("restartable_exit_codes: duplicate codes")
    if spec.termination_grace_seconds < 1:
        raise SpecError("termination_grace_seconds: must be >= 1")
    if spec.ttl_seconds_after_finished < 0:
        raise SpecError("ttl_seconds_after_finished: must be >= 0")
    for port_field in ("coordinator_port", "megascale_port"):
        port = getattr(spec, port_field)
        if not 1 <= port <= 65535:
            raise SpecError(f"{port_field}: must be 1..65535, got {port}")
    for opt in ("service_account", "priority_class"):
        value = getattr(spec, opt)
        if value and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", value):
            raise SpecError(f"{opt}: {value!r} is not a valid Kubernetes object name")
    for opt in ("queue", "kueue_priority", "namespace"):
        value = getattr(spec, opt)
        if value and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", value) or len(value) > 63:
            raise SpecError(f"{opt}: {value!r} is not a valid label value / DNS-1123 label")
    if not spec.namespace:
        raise SpecError("namespace: must not be empty")
    if spec.backend not in ("", "local", "kube"):
        raise SpecError(f"backend: must be local or kube, got {spec.backend!r}")
    if spec.backend == "local" and spec.context:
        raise SpecError("backend: local runs take no --context")
    root = spec.storage_root
    if "://" in root and not root.startswith("gs://"):
        raise SpecError(f"storage: {root!r}: use a local folder or gs://bucket/prefix")
    if root.startswith("gs://") and not re.fullmatch(r"gs://[a-z0-9][-a-z0-9_.]{1,221}[a-z0-9](/.*)?", root):
        raise SpecError(f"storage: {root!r} is not a valid gs://bucket/prefix")
    if spec.backend_name == "kube" and not root.startswith("gs://"):
        raise SpecError("storage: cluster runs need a gs://bucket/prefix storage root (pods cannot see your local folder)")
    for label_field in ("branch", "commit"):
        value = getattr(spec, label_field)
        if value and ("\n" in value or len(value) > 200):
            raise SpecError(f"{label_field}: must be one line of at most 200 characters")
