"""RunSpec: a run's whole description, validated once, with every default in one place.

A spec comes from a YAML run file and/or CLI flags (flags override the file); the
orchestrator reads those (``orchestrator.runfile``) and resolves the storage root, and
hands the values here. Each field carries its one-line doc and its constraint in its
annotation (``Annotated[int, Meta(ge=0, le=100)]``, ``Literal``, patterns): msgspec checks
those when the values are decoded, and :func:`_refusal` says msgspec's refusal in xrun's
words; rules that join fields are :func:`validate`'s. Pure: no I/O, no environment reads. Everything downstream
(manifests, backends, readers) trusts a RunSpec and never re-validates. Errors are
:class:`~xrun_contract.errors.XrunError` (exit 2): one line naming the field and what is
allowed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Annotated, Any, Literal

import msgspec
import msgspec.inspect
from msgspec import Meta

from manifests import catalogue
from manifests.k8s_names import (
    is_dns1123_subdomain,
    is_qualified_name,
    is_valid_label_value,
)
from manifests.limits import MAX_ARG_STRLEN
from xrun_contract import RESTARTABLE_EXIT_CODE, XRUN_VERSION, Env
from xrun_contract.errors import XrunError, did_you_mean, short_repr

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Sane bounds (bad input beyond them): a run that restarts more than 100 times is a crash
# loop; an hour is far beyond any checkpoint-on-SIGTERM (GKE spot VMs give 30 s); a year of
# TTL is as good as none. All fit the API's int32 fields.
MAX_RESTARTS = 100
MAX_GRACE_SECONDS = 3600
MAX_TTL_SECONDS = 365 * 86400
POD_SUFFIX = 6  # "-xxxxx": the random suffix Kubernetes adds to a Job's pod names
MAX_LABEL = 63
# Exit codes that mean "preempted / restart me" (xpk's convention): 42 and 127-255.
DEFAULT_RESTARTABLE_EXIT_CODES = (RESTARTABLE_EXIT_CODE, *range(127, 256))
# xrun's own image (the Dockerfile) at this version: with ``xrun_image`` set to a registry's
# copy of it, every pod's init container and log shipper run it. Unset (the default), a
# cluster run's pods run ``xrun_python_image`` with xrun's pod code fetched from the run's
# storage (manifests.podcode), and a local run this checkout (the manifest then names this).
DEFAULT_XRUN_IMAGE = f"xrun-workload:{XRUN_VERSION}"
# A public image with a python3 (>= 3.12: tarfile's data filter) and nothing of xrun's:
# Docker Hub's official python image (docker.io/library/python), Debian slim variant. Pin it
# by digest (python:3.12-slim@sha256:...) or point it at a mirror with xrun_python_image.
DEFAULT_XRUN_PYTHON_IMAGE = "python:3.12-slim"
# What a cluster run's xrun_image must look like: a registry host first, so a node can pull it
# (the default above is for local runs; no registry has it).
CLUSTER_XRUN_IMAGE_HINT = ("an image in a registry the nodes can pull from, its first path component a "
                           "registry host (with a '.' or ':', or localhost), e.g. "
                           f"us-docker.pkg.dev/PROJECT/REPO/xrun-workload:{XRUN_VERSION}: build the Dockerfile, "
                           "push it, set xrun_image (README \"Any image\")")
# capacity: what GKE provisions the nodes from (rendered by manifests.jobset.capacity_*).
# A shared reservation: reservation:projects/<project>/reservations/<name>.
CAPACITIES = ("on-demand", "spot", "reservation:<name>", "flex-start")
# priority: xpk's PriorityClass ladder (xpk templates/kueue_config.yaml.j2 creates these classes).
PRIORITY_LADDER = {"very-low": 100, "low": 250, "medium": 500, "high": 750, "very-high": 1000}
# scheduler: GKE's topology-aware scheduler is asked for with a pod scheduling gate, as xpk
# renders it (its workload.py get_gpu_scheduler); any other name is the pod's schedulerName.
TOPOLOGY_AWARE_SCHEDULER = "gke.io/topology-aware-auto"
# Its gate is "<scheduler>-<run name>", a qualified name (kubernetes pkg/apis/core/validation/
# validation.go validateSchedulingGates -> ValidateQualifiedName): the part after the "/" at
# most 63 characters, so a run name of at most 63 - len("topology-aware-auto-") = 43.
MAX_TOPOLOGY_GATE_NAME = MAX_LABEL - len(TOPOLOGY_AWARE_SCHEDULER.partition("/")[2] + "-")
# On TPU7x GKE hands libtpu port 8476, xrun's default coordinator port, and under hostNetwork
# both would bind it on the node: those runs default to 8482, the port JAX's own Cloud TPU
# cluster detection moved to in 0.8.1 (jax/_src/clusters/cloud_tpu_cluster.py; jax-ml/jax#35905).
LIBTPU_HOLDS_8476 = ("tpu7x",)
TPU7X_COORDINATOR_PORT = 8482
# queue: this value submits without Kueue on purpose (no queue label, no look-up of the
# namespace's LocalQueues).
QUEUE_NONE = "none"
# kueue_topology: Kueue's topology-aware scheduling (pod template annotations).
KUEUE_TOPOLOGY_MODES = ("required", "preferred")
TOLERATION_KEYS = {"key", "operator", "value", "effect", "toleration_seconds"}
MOUNT_KEYS = {"bucket", "pvc", "path", "read_only", "options"}
# Label/annotation prefixes the JobSet and Job controllers own on pods.
CONTROLLER_PREFIXES = ("jobset.sigs.k8s.io/", "batch.kubernetes.io/", "controller-uid", "job-name")
# Flags only libtpu defines. jaxlib parses XLA_FLAGS itself and aborts on a flag it does not
# know (xla/parse_flags_from_env.cc ParseFlagsFromEnvAndDieIfUnknown: "Unknown flags in
# XLA_FLAGS"), so these must travel in LIBTPU_INIT_ARGS, which libtpu parses.
TPU_ONLY_FLAG_PREFIXES = ("--xla_tpu_", "--megascale_")
# Flags only the GPU backend defines: libtpu does not know them either.
GPU_ONLY_FLAG_PREFIXES = ("--xla_gpu_",)


# Field types with their constraint beside them: msgspec checks these when a spec is decoded
# (``_decode``), and ``extra["allowed"]`` is what a refusal says is allowed where the
# constraint alone would not say it in words.
Sha256 = Annotated[str, Meta(pattern=r"^([0-9a-f]{64})?\Z", extra={"allowed": "64 lowercase hex digits"})]
ObjectName = Annotated[str, Meta(pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?)?\Z", extra={
    "allowed": "a Kubernetes object name (lowercase letters, digits, '-' and '.')"})]
LabelName = Annotated[str, Meta(max_length=MAX_LABEL, pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?\Z", extra={
    "allowed": "a valid label value / DNS-1123 label (lowercase letters, digits, '-'; at most 63)"})]
OneLine = Annotated[str, Meta(max_length=200, pattern=r"^[^\n]*\Z",
                              extra={"allowed": "one line of at most 200 characters"})]
Port = Annotated[int, Meta(ge=1, le=65535)]
ExitCode = Annotated[int, Meta(ge=1, le=255)]


def _doc(text: str, **meta: Any) -> Meta:
    """A field's one-line doc (and constraint, where it has one) as msgspec metadata."""
    return Meta(description=text, **meta)


@dataclass
class RunSpec:
    """A run's description. Flags over a run file: ``extra={"flags": "merge"}`` maps merge
    per key, ``extra={"flags": "add"}`` lists add to the file's; any other field is replaced."""

    name: Annotated[str, _doc("the run's name: a DNS-1035 label (checked with its length by validate)")] = ""
    image: Annotated[str, _doc("the user's container: any image with /bin/sh")] = ""
    command: Annotated[str, _doc("the shell command the workload container runs")] = "python3 -m workload.train"
    xrun_image: Annotated[str, _doc(
        "xrun's image for the init container + log shipper; '' = none: a cluster run's pods run "
        "xrun_python_image with xrun's pod code from storage")] = ""
    xrun_python_image: Annotated[str, _doc("a public python3 image for xrun's pod code")] = DEFAULT_XRUN_PYTHON_IMAGE
    pod_code_sha256: Annotated[Sha256, _doc(
        "sha256 of <storage>/xrun-pod/<sha>.zip, set by the orchestrator (manifests.podcode)")] = ""
    accelerator: Annotated[str, _doc("a catalogue shape (v6e-32, h200-141gb-8) or cpu-N")] = ""
    num_slices: Annotated[int, _doc("TPU multislice: how many slices", ge=1)] = 1
    nodes: Annotated[int, _doc("GPU nodes", ge=1)] = 1
    cpu_devices_per_host: Annotated[int, _doc("cpu-N shapes only: XLA host devices", ge=1, le=64)] = 2
    storage: Annotated[str, _doc("local folder or gs://bucket/prefix (resolved by the orchestrator)")] = ""
    env: Annotated[dict[str, str], _doc("the container's environment", extra={"flags": "merge"})] = field(
        default_factory=dict)
    max_restarts: Annotated[int, _doc("JobSet failurePolicy.maxRestarts", ge=0, le=MAX_RESTARTS)] = 3
    restartable_exit_codes: Annotated[list[ExitCode], _doc(
        "exit codes that mean 'restart me'", min_length=1,
        extra={"allowed": "a non-empty list of codes in 1..255"})] = field(
        default_factory=lambda: list(DEFAULT_RESTARTABLE_EXIT_CODES))
    termination_grace_seconds: Annotated[int, _doc(
        "SIGTERM to SIGKILL: time to checkpoint", ge=1, le=MAX_GRACE_SECONDS)] = 120
    ttl_seconds_after_finished: Annotated[int, _doc(
        "how long a finished JobSet stays", ge=0, le=MAX_TTL_SECONDS)] = 86400
    # Not a GCS identity for TPU/GPU pods: they use hostNetwork, where GKE Workload Identity
    # does not apply (the node's account does).
    service_account: Annotated[ObjectName, _doc("pod serviceAccountName; omitted when empty")] = ""
    priority_class: Annotated[ObjectName, _doc("pod priorityClassName (the older spelling of priority)")] = ""
    queue: Annotated[LabelName, _doc(
        "Kueue LocalQueue; '' = the namespace's only one (orchestrator.services.cluster), "
        "QUEUE_NONE = without Kueue")] = ""
    kueue_priority: Annotated[LabelName, _doc("label kueue.x-k8s.io/priority-class")] = ""
    privileged: Annotated[bool, _doc("run the workload container privileged")] = False
    coordinator_port: Annotated[Port, _doc(
        "jax.distributed coordinator on process 0 (TPU7x: TPU7X_COORDINATOR_PORT)")] = 8476
    megascale_port: Annotated[Port, _doc("TPU multislice (megascale) port")] = 8080
    branch: Annotated[OneLine, _doc("for reports: the branch the image (or the workdir) was built from")] = ""
    commit: Annotated[OneLine, _doc("for reports: the commit the image (or the workdir) was built from")] = ""
    # The user's working tree, shipped through the run's storage (orchestrator/workdir.py packs
    # it; the init container unpacks it; the command runs there). The orchestrator fills
    # ``code_sha256`` (the archive <root>/code/<sha256>.tar.gz) when it packs ``workdir``; a
    # run file may name an archive already uploaded instead.
    workdir: Annotated[str, _doc("the folder to ship and run in", max_length=4096, pattern=r"^[^\n]*\Z",
                                 extra={"allowed": "one line, a folder's path"})] = ""
    code_sha256: Annotated[Sha256, _doc("the workdir's archive under <storage>/code/")] = ""
    backend: Annotated[Literal["", "local", "kube"], _doc(
        "where to submit: '' (local unless a context is named)", extra={"allowed": "local or kube"})] = ""
    context: Annotated[str, _doc("kubeconfig context")] = ""
    namespace: Annotated[LabelName, _doc(
        "'' = the kubeconfig context's (the manifest then names none, as kubectl expects)")] = ""
    # --- GKE operator knobs (README "GKE knobs"; xpk flag names alongside) -------------
    capacity: Annotated[str, _doc("on-demand | spot | reservation:<name> | flex-start")] = "on-demand"
    node_selector: Annotated[dict[str, str], _doc("merged with xrun's", extra={"flags": "merge"})] = field(
        default_factory=dict)
    tolerations: Annotated[list[dict[str, Any]], _doc("added to xrun's", extra={"flags": "add"})] = field(
        default_factory=list)
    pod_annotations: Annotated[dict[str, str], _doc("on every pod", extra={"flags": "merge"})] = field(
        default_factory=dict)
    pod_labels: Annotated[dict[str, str], _doc("on every pod", extra={"flags": "merge"})] = field(
        default_factory=dict)
    priority: Annotated[str, _doc("very-low..very-high (xpk's ladder) or a PriorityClass name")] = ""
    mounts: Annotated[list[dict[str, Any]], _doc("GCS buckets, PVCs", extra={"flags": "add"})] = field(
        default_factory=list)
    scheduler: Annotated[str, _doc("schedulerName, or gke.io/topology-aware-auto (a scheduling gate)")] = ""
    kueue_topology: Annotated[str, _doc("required:<node label> | preferred:<node label>")] = ""
    image_pull_secrets: Annotated[list[str], _doc(
        "dockerconfigjson Secrets for a private registry (xpk --docker-image-pull-secret)",
        extra={"flags": "add"})] = field(default_factory=list)
    networks: Annotated[list[str], _doc(
        "GKE Network objects for a GPU stack's NICs eth1.. (default: accelerators.yaml's)",
        extra={"flags": "add"})] = field(default_factory=list)

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
    def priority_class_name(self) -> str:
        """The pod's priorityClassName: ``priority`` (a ladder name is xpk's class of that
        name) or the older raw ``priority_class``."""
        return self.priority or self.priority_class

    @property
    def queue_name(self) -> str:
        """The LocalQueue the JobSet is labelled with ("" for none)."""
        return "" if self.queue == QUEUE_NONE else self.queue

    @property
    def reservation(self) -> str:
        """The reservation's name (a shared one's project is in ``capacity`` too)."""
        if not self.capacity.startswith("reservation:"):
            return ""
        return self.capacity.rsplit("/", 1)[-1].removeprefix("reservation:")

    @property
    def backend_name(self) -> str:
        return self.backend or ("kube" if self.context else "local")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = {f.name: f for f in fields(RunSpec)}


# ---------------------------------------------------------------------------------------
# Building


def env_values(mapping: dict[Any, Any], where: str) -> dict[str, str]:
    """An env mapping as strings (YAML true -> "true"); nested values are refused."""
    out = {}
    for k, v in mapping.items():
        if isinstance(v, dict | list) or v is None:
            raise XrunError(f"{where}.{k}: must be a string, number or bool")
        out[str(k)] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


MAX_INT_DIGITS = 18  # an int64's worth: every integer field's limit is far below


def _digits(value: int) -> int:
    """How many decimal digits ``value`` has, also past Python's int-to-str limit."""
    try:
        return len(str(abs(value)))
    except ValueError:
        return int(abs(value).bit_length() * 0.30102999566398) + 1


_INFO = msgspec.inspect.type_info(RunSpec)
assert isinstance(_INFO, msgspec.inspect.DataclassType)
_TYPES = {f.name: f.type for f in _INFO.fields}  # each field's type, constraint and doc


def _bare(t: msgspec.inspect.Type) -> msgspec.inspect.Type:
    """The type under a field's doc metadata."""
    return t.type if isinstance(t, msgspec.inspect.Metadata) else t


def _extra(name: str) -> dict[str, Any]:
    t = _TYPES[name]
    return (t.extra or {}) if isinstance(t, msgspec.inspect.Metadata) else {}


def _as_written(name: str, value: Any) -> Any:
    """A run file's YAML scalars as the field's type wants them, before msgspec checks it:
    numbers where text is wanted (``commit: 1234567``), digit strings where an integer is, a
    single name where a list of names is, env-style mappings of scalars as strings. Integers
    longer than any field allows are refused here, before anything formats them."""
    t = _bare(_TYPES[name])
    if isinstance(t, msgspec.inspect.IntType) and isinstance(value, int | str) and not isinstance(value, bool):
        text = value.strip() if isinstance(value, str) else ""
        if isinstance(value, str) and not re.fullmatch(r"-?\d+", text):
            return value
        digits = len(text.lstrip("-")) if isinstance(value, str) else _digits(value)
        if digits > MAX_INT_DIGITS:  # a refusal quoting a 4,000-digit number is no line (and
            # past 4,300 digits Python will not format it)
            raise XrunError(f"{name}: must be an integer of at most {MAX_INT_DIGITS} digits, "
                            f"got one of {digits} digits")
        return int(value)
    if isinstance(t, msgspec.inspect.StrType) and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if isinstance(t, msgspec.inspect.DictType) and isinstance(value, dict):
        return env_values(value, name)
    if isinstance(t, msgspec.inspect.ListType) and isinstance(t.item_type, msgspec.inspect.StrType) \
            and isinstance(value, str):
        return [value]
    return value


def _allowed(t: msgspec.inspect.Type) -> str:
    """What a field of type ``t`` takes, in the words of a refusal."""
    if isinstance(t, msgspec.inspect.Metadata):
        return (t.extra or {}).get("allowed") or _allowed(t.type)
    if isinstance(t, msgspec.inspect.BoolType):
        return "true or false"
    if isinstance(t, msgspec.inspect.IntType):
        if t.ge is not None and t.le is not None:
            return f"{t.ge}..{t.le}"
        return f">= {t.ge}" if t.ge is not None else "an integer"
    if isinstance(t, msgspec.inspect.DictType):
        return "a mapping of NAME: value"
    if isinstance(t, msgspec.inspect.ListType):
        item = _bare(t.item_type)
        return "a list of " + ("integers" if isinstance(item, msgspec.inspect.IntType) else
                               "names" if isinstance(item, msgspec.inspect.StrType) else "mappings")
    if isinstance(t, msgspec.inspect.LiteralType):
        return " or ".join(str(v) for v in t.values if v != "")
    return "a string"


_KINDS = {"int": "an integer", "bool": "true or false", "str": "a string"}


def _refusal(error: msgspec.ValidationError, values: dict[str, Any]) -> str:
    """msgspec's refusal (``Expected `int` <= 100 - at `$.max_restarts```) in xrun's words:
    the field, what it takes, what it got."""
    m = re.fullmatch(r"(?s)(.*) - at `\$\.(\w+)(.*)`", str(error))
    if not m or m[2] not in _TYPES:
        return f"run spec: {error}"
    what, name = m[1], m[2]
    value = values.get(name)
    got = (f"an integer of {_digits(value)} digits" if isinstance(value, int) and _digits(value) > MAX_INT_DIGITS
           else short_repr(value))
    kind = re.match(r"Expected `(\w+)`, got", what)
    if kind and kind[1] in _KINDS and not m[3]:  # the wrong type, not a value out of range
        return f"{name}: must be {_KINDS[kind[1]]}, got {got}"
    return f"{name}: must be {_allowed(_TYPES[name])}, got {got}"


def _decode(values: dict[str, Any]) -> RunSpec:
    """The values (known keys only) as a RunSpec, each field's type and constraint checked."""
    try:
        return msgspec.convert(values, RunSpec)
    except msgspec.ValidationError as e:
        raise XrunError(_refusal(e, values)) from None


def build_spec(file_values: dict[str, Any], flag_values: dict[str, Any],
               storage_default: str = "") -> RunSpec:
    """Merge run-file values and CLI flags (flags win; maps merge, flags win per key; the
    tolerations, mounts and names of flags add to the file's: each field's ``flags`` rule).

    ``storage_default`` is the root used when neither names one (the orchestrator resolves
    it from ``$XRUN_STORAGE`` or the per-user folder: this module reads no environment).
    """
    _known_keys("run file", file_values, FIELDS)
    for name, value in file_values.items():
        if value is None:
            raise XrunError(f"{name}: empty value in run file; remove the key or give a value")
    flag_values = {k: v for k, v in flag_values.items() if v is not None}
    merged: dict[str, Any] = {}
    for source in (file_values, flag_values):
        given = {name: _as_written(name, value) for name, value in source.items()}
        checked = _decode(given)  # each source on its own, so a merge only meets checked values
        for name in given:
            value, rule = getattr(checked, name), _extra(name).get("flags")
            if rule == "merge":  # env, node_selector, pod_*: per key
                merged[name] = {**merged.get(name, {}), **value}
            elif rule == "add":  # tolerations, mounts, secrets, networks: added
                merged[name] = merged.get(name, []) + value
            else:
                merged[name] = value
    if not merged.get("storage") and storage_default:
        merged["storage"] = storage_default
    shape = catalogue.shapes().get(str(merged.get("accelerator", "")))
    if "coordinator_port" not in merged and shape is not None and shape.family in LIBTPU_HOLDS_8476:
        merged["coordinator_port"] = TPU7X_COORDINATOR_PORT
    spec = RunSpec(**merged)
    validate(spec)
    return spec


def max_name_length(spec: RunSpec) -> int:
    """Longest JobSet name whose pod names <name>-slice-<j>-<p>-xxxxx fit in 63 characters."""
    j = len(str(spec.slices - 1))
    p = len(str(spec.hosts_per_slice - 1))
    return MAX_LABEL - len("-slice-") - j - 1 - p - POD_SUFFIX


def topology_gate(name: str) -> str:
    """The pod scheduling gate GKE's topology-aware scheduler releases, named as xpk names it
    (xpk src/xpk/core/scheduling.py get_gpu_scheduler: ``f"{args.scheduler}-{args.workload}"``)."""
    return f"{TOPOLOGY_AWARE_SCHEDULER}-{name}"


def check_flag_envs(env: dict[str, str], shape: catalogue.Shape) -> None:
    """Each flag in the env that carries it, where that is knowable: TPU-only flags never in
    XLA_FLAGS (jaxlib aborts at start-up), GPU-only flags never in LIBTPU_INIT_ARGS."""
    for flag in env.get("XLA_FLAGS", "").split():
        if flag.startswith(TPU_ONLY_FLAG_PREFIXES):
            raise XrunError(f"env: XLA_FLAGS carries the TPU flag {flag.split('=')[0]}, which jaxlib does not know "
                            "(it aborts at start-up: 'Unknown flag in XLA_FLAGS'); put TPU flags in LIBTPU_INIT_ARGS")
    for flag in env.get("LIBTPU_INIT_ARGS", "").split():
        if flag.startswith(GPU_ONLY_FLAG_PREFIXES):
            raise XrunError(f"env: LIBTPU_INIT_ARGS carries the GPU flag {flag.split('=')[0]}, which libtpu does "
                            "not know; put GPU flags in XLA_FLAGS")
    if env.get("LIBTPU_INIT_ARGS", "").strip() and shape.kind == "gpu":
        raise XrunError(f"env: LIBTPU_INIT_ARGS is read only by libtpu and {shape.name} has no TPU; "
                        "put XLA flags in XLA_FLAGS")


def image_registry(image: str) -> str:
    """The registry host of an image reference, "" when it names none (Docker's reference
    grammar, distribution/reference splitDockerDomain: the first path component is a host when
    it holds a '.' or ':' or is ``localhost``; otherwise the name is Docker Hub's
    ``docker.io/library/...``, which is where Kubernetes then pulls it from)."""
    first, slash, _ = image.partition("/")
    if slash and (("." in first or ":" in first) or first == "localhost"):
        return first
    return ""


def check_cluster_xrun_image(spec: RunSpec) -> None:
    """A cluster run's pods pull ``xrun_image``, when set, for their init container and log
    shipper: one without a registry host (e.g. ``xrun-workload:<version>``) is Docker Hub's
    library, which has no such image, and every pod would stay Init:ErrImagePull."""
    if spec.backend_name == "kube" and spec.xrun_image and not image_registry(spec.xrun_image):
        raise XrunError(f"xrun_image: {spec.xrun_image!r} names no registry, so the cluster's nodes cannot pull it; "
                        f"cluster runs need {CLUSTER_XRUN_IMAGE_HINT}")


def validate(spec: RunSpec) -> None:
    """Each field's type and constraint (msgspec, from the field's annotation; again here, as
    callers ``dataclasses.replace`` a spec), then the rules that join fields."""
    _decode(msgspec.to_builtins(spec))
    if not spec.name:
        raise XrunError("name: required (a DNS-1035 label: lowercase letters, digits, '-')")
    if not DNS1035.match(spec.name):
        raise XrunError(
            f"name: {short_repr(spec.name)} is not a DNS-1035 label (lowercase letters, digits and '-', "
            "starting with a letter, ending with a letter or digit)"
        )
    if not spec.accelerator:
        raise XrunError("accelerator: required (e.g. v6e-8, v6e-32, h200-141gb-8, cpu-2)")
    try:
        shape = spec.shape
    except catalogue.UnknownAccelerator as e:
        raise XrunError(f"accelerator: {e}") from None
    if spec.num_slices > 1 and shape.kind != "tpu":
        raise XrunError(f"num_slices: multislice is for TPU shapes only, not {spec.accelerator}")
    if spec.num_slices > 1 and shape.single_host:
        # cloud.google.com/tpu/docs/tpu-gke-multislice: "Multislice only supports multi-host
        # TPU slice node pools".
        multi = [n for n, s in catalogue.shapes().items()
                 if s.family == shape.family and not s.single_host][:1]
        raise XrunError(f"num_slices: {spec.accelerator} is a single-host slice and GKE runs multislice only on "
                        f"multi-host slices; use num_slices 1 or a multi-host shape (e.g. {', '.join(multi)})")
    if spec.nodes > 1 and shape.kind != "gpu":
        raise XrunError(f"nodes: only for GPU shapes; {spec.accelerator} has a fixed host count")
    limit = max_name_length(spec)
    if len(spec.name) > limit:
        raise XrunError(
            f"name: {short_repr(spec.name)} is {len(spec.name)} characters; at most {limit} for "
            f"{spec.slices} slice(s) x {spec.hosts_per_slice} hosts, so pod names "
            "<name>-slice-<j>-<p>-xxxxx stay within 63"
        )
    if spec.scheduler == TOPOLOGY_AWARE_SCHEDULER and len(spec.name) > MAX_TOPOLOGY_GATE_NAME:
        # A longer name passes the JobSet's admission, then every Job creation fails
        # (JobCreationFailed, no pods): the gate is validated on the pod template.
        raise XrunError(
            f"name: {spec.name!r} is {len(spec.name)} characters; at most {MAX_TOPOLOGY_GATE_NAME} with "
            f"scheduler: {TOPOLOGY_AWARE_SCHEDULER}, so the pod scheduling gate {topology_gate('<name>')} "
            "stays a qualified name (at most 63 characters after the '/')"
        )
    if not spec.image.strip():
        raise XrunError("image: required (the workload container image, e.g. us-docker.pkg.dev/p/r/xrun:tag)")
    if any(c.isspace() for c in spec.image):
        raise XrunError(f"image: must not contain whitespace, got {short_repr(spec.image)}")
    if any(c.isspace() for c in spec.xrun_image):
        raise XrunError(f"xrun_image: must be an image name without whitespace (or unset: "
                        f"{DEFAULT_XRUN_PYTHON_IMAGE} with xrun's code from storage), "
                        f"got {short_repr(spec.xrun_image)}")
    if not spec.xrun_python_image.strip() or any(c.isspace() for c in spec.xrun_python_image):
        raise XrunError(f"xrun_python_image: must be an image name without whitespace, with a python3 >= 3.12 "
                        f"(default {DEFAULT_XRUN_PYTHON_IMAGE}), got {short_repr(spec.xrun_python_image)}")
    if not spec.command.strip():
        raise XrunError("command: must not be empty (default: python3 -m workload.train)")
    try:
        # shlex is quadratic in a token's length (it grows the token a character at a time):
        # a command past what one argument of execve can hold is refused by name at render
        # (manifests.limits), without minutes of parsing first.
        if len(spec.command) <= MAX_ARG_STRLEN:
            shlex.split(spec.command)
    except ValueError as e:
        raise XrunError(f"command: cannot be parsed as a shell command: {e}") from None
    reserved = Env.all_names()
    for key, value in spec.env.items():
        if not ENV_NAME.match(key):
            raise XrunError(f"env: {short_repr(key)} is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if key in reserved and not key.startswith("XRUN_TEST_"):
            raise XrunError(f"env: {key} is set by xrun itself; choose another name")
        if "\x00" in value:
            raise XrunError(f"env: value of {key} contains a NUL byte")
    check_flag_envs(spec.env, shape)
    if len(set(spec.restartable_exit_codes)) != len(spec.restartable_exit_codes):
        raise XrunError("restartable_exit_codes: duplicate codes")
    if spec.coordinator_port == 8476 and spec.accelerator in catalogue.shapes() \
            and spec.shape.family in LIBTPU_HOLDS_8476:
        raise XrunError(f"coordinator_port: 8476 is libtpu's on {spec.accelerator} nodes (a host port under "
                        f"hostNetwork); leave it out for {TPU7X_COORDINATOR_PORT}, or pick another")
    if spec.backend == "local" and spec.context:
        raise XrunError("backend: local runs take no --context")
    root = spec.storage
    if not root:
        raise XrunError("storage: required (a folder or gs://bucket/prefix)")
    if "://" in root and not root.startswith("gs://"):
        raise XrunError(f"storage: {short_repr(root)}: use a local folder or gs://bucket/prefix")
    if root.startswith("gs://") and not re.fullmatch(r"gs://[a-z0-9][-a-z0-9_.]{1,221}[a-z0-9](/.*)?", root):
        raise XrunError(f"storage: {short_repr(root)} is not a valid gs://bucket/prefix")
    if spec.backend_name == "kube" and not root.startswith("gs://"):
        raise XrunError("storage: cluster runs need a gs://bucket/prefix storage root "
                        "(pods cannot see your local folder)")
    validate_gke_knobs(spec)


def _key_value_map(name: str, mapping: dict[str, str], values_are_labels: bool) -> None:
    """Keys qualified names (ValidateLabels / ValidateAnnotations); label values when asked."""
    for key, value in mapping.items():
        for m in is_qualified_name(key):
            raise XrunError(f"{name}: key {short_repr(key)}: {m}")
        if key.startswith(CONTROLLER_PREFIXES):
            raise XrunError(f"{name}: {short_repr(key)} is set by the JobSet/Job controllers on every pod; "
                            "choose another key")
        if values_are_labels:
            for m in is_valid_label_value(value):
                raise XrunError(f"{name}: {key}={short_repr(value)}: {m}")


def _known_keys(where: str, given: Iterable[str], allowed: Iterable[str]) -> None:
    """One line naming the first unknown key and every allowed one."""
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise XrunError(f"{where}: unknown key {short_repr(unknown[0])}{did_you_mean(unknown[0], allowed)}; "
                        f"allowed: {', '.join(sorted(allowed))}")


def _toleration(i: int, tol: dict[str, Any]) -> None:
    """core validation.go ValidateTolerations, on the run-file form (snake_case keys)."""
    where = f"tolerations[{i}]"
    _known_keys(where, tol, TOLERATION_KEYS)
    key, op = str(tol.get("key", "")), str(tol.get("operator", "Equal"))
    value, effect = tol.get("value", ""), str(tol.get("effect", ""))
    if not isinstance(value, str):
        raise XrunError(f"{where}.value: must be a string (quote \"true\")")
    for m in is_qualified_name(key) if key else []:
        raise XrunError(f"{where}.key: {short_repr(key)}: {m}")
    if op not in ("Equal", "Exists"):
        raise XrunError(f"{where}.operator: must be Equal or Exists, got {short_repr(op)}")
    if not key and op != "Exists":
        raise XrunError(f"{where}.operator: must be Exists when key is empty")
    if op == "Exists" and value:
        raise XrunError(f"{where}.value: must be empty with operator Exists")
    for m in is_valid_label_value(value) if op == "Equal" else []:
        raise XrunError(f"{where}.value: {short_repr(value)}: {m}")
    if effect not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        raise XrunError(f"{where}.effect: must be NoSchedule, PreferNoSchedule or NoExecute, got {short_repr(effect)}")
    seconds = tol.get("toleration_seconds")
    if seconds is not None and (effect != "NoExecute" or isinstance(seconds, bool) or not isinstance(seconds, int)):
        raise XrunError(f"{where}.toleration_seconds: an integer, only with effect NoExecute")


def _mount(i: int, mount: dict[str, Any]) -> None:
    where = f"mounts[{i}]"
    _known_keys(where, mount, MOUNT_KEYS)
    if ("bucket" in mount) == ("pvc" in mount):
        raise XrunError(f"{where}: give exactly one of bucket (a GCS bucket, through the GCS FUSE CSI driver) "
                        "or pvc (an existing PersistentVolumeClaim)")
    path = mount.get("path")
    if not isinstance(path, str) or not path.startswith("/") or ":" in path or "\n" in path:
        raise XrunError(f"{where}.path: an absolute path in the container, got {short_repr(path)}")
    if not isinstance(mount.get("read_only", False), bool):
        raise XrunError(f"{where}.read_only: must be true or false")
    if "bucket" in mount:
        bucket = mount["bucket"]
        if not isinstance(bucket, str) or not re.fullmatch(r"[a-z0-9][-a-z0-9_.]{1,221}[a-z0-9]", bucket):
            raise XrunError(f"{where}.bucket: a GCS bucket name (no gs://), got {short_repr(bucket)}")
        if "options" in mount and not isinstance(mount["options"], str):
            raise XrunError(f"{where}.options: gcsfuse mount options as one string, e.g. implicit-dirs,only-dir=data")
    else:
        if "options" in mount:
            raise XrunError(f"{where}.options: only for bucket mounts")
        claim = mount["pvc"]
        if not isinstance(claim, str) or is_dns1123_subdomain(claim):
            raise XrunError(f"{where}.pvc: a PersistentVolumeClaim name (DNS-1123 subdomain), got {short_repr(claim)}")


def validate_gke_knobs(spec: RunSpec) -> None:
    """capacity, placement, priority, mounts, scheduler and Kueue topology (issue #18)."""
    cap = spec.capacity
    if cap.startswith("reservation:"):
        path = cap.removeprefix("reservation:")
        parts = path.split("/")
        if "/" in path and not (len(parts) == 4 and parts[0] == "projects" and parts[2] == "reservations"
                                and re.fullmatch(r"[a-z][-a-z0-9]{4,28}[a-z0-9]", parts[1])):
            raise XrunError(f"capacity: {short_repr(cap)} is not reservation:NAME or reservation:projects/PROJECT/"
                            "reservations/NAME (a shared reservation; PROJECT a project ID)")
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", spec.reservation):
            raise XrunError(f"capacity: reservation name {short_repr(spec.reservation)} is not a Compute Engine name "
                            "(lowercase letters, digits, '-', at most 63)")
    elif cap not in ("on-demand", "spot", "flex-start"):
        raise XrunError(f"capacity: must be one of {' | '.join(CAPACITIES)}, got {short_repr(cap)}")
    if cap != "on-demand" and spec.shape.kind == "cpu":
        raise XrunError(f"capacity: {cap} is for TPU and GPU node pools, not {spec.accelerator}")
    _key_value_map("node_selector", spec.node_selector, values_are_labels=True)
    _key_value_map("pod_labels", spec.pod_labels, values_are_labels=True)
    _key_value_map("pod_annotations", spec.pod_annotations, values_are_labels=False)
    for i, tol in enumerate(spec.tolerations):
        _toleration(i, tol)
    for i, mount in enumerate(spec.mounts):
        _mount(i, mount)
    paths = [m["path"].rstrip("/") or "/" for m in spec.mounts]
    for path in paths:
        if paths.count(path) > 1:
            raise XrunError(f"mounts: {path} is mounted twice")
    if spec.priority and spec.priority_class:
        raise XrunError(f"priority: give priority ({short_repr(spec.priority)}) or priority_class "
                        f"({short_repr(spec.priority_class)}), not both")
    if spec.priority and spec.priority not in PRIORITY_LADDER and is_dns1123_subdomain(spec.priority):
        raise XrunError(f"priority: one of {', '.join(PRIORITY_LADDER)} or a PriorityClass name, "
                        f"got {short_repr(spec.priority)}")
    if spec.scheduler == TOPOLOGY_AWARE_SCHEDULER and spec.shape.kind != "gpu":
        # xpk gates only GPU workloads (src/xpk/commands/workload.py calls get_gpu_scheduler
        # only for AcceleratorType.GPU; its TPU template puts --scheduler in schedulerName,
        # where a name with "/" is no DNS-1123 subdomain and the pods are refused).
        raise XrunError(f"scheduler: {TOPOLOGY_AWARE_SCHEDULER} is GKE's topology-aware scheduling for GPU "
                        f"node pools (xpk gates only GPU workloads), not for {spec.accelerator}")
    if spec.scheduler and spec.scheduler != TOPOLOGY_AWARE_SCHEDULER and is_dns1123_subdomain(spec.scheduler):
        raise XrunError(f"scheduler: {TOPOLOGY_AWARE_SCHEDULER} or a scheduler name (DNS-1123 subdomain), "
                        f"got {short_repr(spec.scheduler)}")
    stack = spec.shape.networking if spec.shape.kind == "gpu" else None
    if spec.networks:
        want = len(stack.networks) if stack else 0
        if not want:
            raise XrunError(f"networks: only for GPU shapes whose networking stack attaches NICs "
                            f"(h100-80gb-8, h100-mega-80gb-8, h200-141gb-8, b200-8), not {spec.accelerator}")
        if len(spec.networks) != want:
            raise XrunError(f"networks: {spec.accelerator} ({stack.name}) attaches {want} NICs, so name {want} "  # type: ignore[union-attr]
                            f"Network objects (eth1..eth{want}), got {len(spec.networks)}")
        for i, net in enumerate(spec.networks):
            if is_dns1123_subdomain(net):
                raise XrunError(f"networks[{i}]: a Network object's name (DNS-1123 subdomain), got {short_repr(net)}")
            if spec.networks.index(net) != i:
                raise XrunError(f"networks: {net} is named twice")
    for i, secret in enumerate(spec.image_pull_secrets):
        if is_dns1123_subdomain(secret):
            raise XrunError(f"image_pull_secrets[{i}]: a Secret name (DNS-1123 subdomain), got {short_repr(secret)}")
        if spec.image_pull_secrets.index(secret) != i:
            raise XrunError(f"image_pull_secrets: {secret} is named twice")
    if spec.kueue_topology:
        mode, _, level = spec.kueue_topology.partition(":")
        if mode not in KUEUE_TOPOLOGY_MODES or not level or is_qualified_name(level):
            raise XrunError("kueue_topology: required:<node label> or preferred:<node label> (e.g. "
                            f"preferred:cloud.google.com/gce-topology-block), got {short_repr(spec.kueue_topology)}")
        if not spec.queue_name:
            raise XrunError("kueue_topology: needs queue "
                            "(Kueue's topology-aware scheduling admits through a LocalQueue)")
