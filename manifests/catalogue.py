"""Accelerator shapes, loaded from the data table ``accelerators.yaml``.

Every number the manifests, the workload (MFU, memory %) and the compare report need about
an accelerator comes from here. ``cpu-N`` shapes are synthesised: N local hosts with a
configurable number of CPU devices each, for the local backend.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from manifests import types as t

_TABLE = Path(__file__).with_name("accelerators.yaml")
_CPU_RE = re.compile(r"^cpu-(\d+)$")
# A generous but finite bound for local CPU hosts (each is a real process here).
MAX_CPU_HOSTS = 64


class UnknownAccelerator(ValueError):
    pass


@dataclass(frozen=True)
class Networking:
    """A GPU networking stack (accelerators.yaml ``networking``): what a pod of a family
    needs beyond its GPUs, typed through ``manifests.types`` so a typo in the table fails
    at load, not on a cluster."""

    name: str  # tcpx | tcpxo | rdma
    networks: tuple[str, ...]  # GKE Network objects for eth1.. (eth0 is "default")
    annotations: dict[str, str]
    tolerations: tuple[t.Toleration, ...]
    volumes: tuple[t.Volume, ...]
    sidecars: tuple[t.Container, ...]
    mounts: tuple[t.VolumeMount, ...]
    env: dict[str, str]
    # The NCCL plugin's env file on the node, sourced by the launcher when present, and the
    # env exported instead when it is absent (accelerators.yaml env_profile, env_fallback).
    env_profile: str = ""
    env_fallback: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Shape:
    name: str  # e.g. v6e-32
    kind: str  # tpu | gpu | cpu
    family: str  # e.g. v6e
    gke_accelerator: str  # node label value ("" for cpu)
    topology: str  # e.g. 4x8 ("" for gpu and cpu)
    vms: int  # hosts per slice (GPU: per node group of one node; scaled by --nodes)
    devices_per_vm: int  # chips / GPUs per host (cpu: default forced devices)
    peak_bf16_tflops: float  # per device
    hbm_bytes: int  # per device
    machine_type: str = ""  # GCE machine type of the node pool (TPU: label node.kubernetes.io/instance-type)
    nics: int = 0  # GPU: every NIC of the VM
    networking: Networking | None = None  # GPU: the stack its pods need
    jax_devices_per_chip: int = 1  # TPU7x: two TensorCores, each a JAX device

    @property
    def jax_devices_per_vm(self) -> int:
        """What ``jax.local_device_count()`` says on one host."""
        return self.devices_per_vm * self.jax_devices_per_chip

    @property
    def single_host(self) -> bool:
        return self.vms == 1

    @property
    def devices_per_slice(self) -> int:
        return self.vms * self.devices_per_vm

    @property
    def hbm_gib(self) -> float:
        return self.hbm_bytes / 2**30


def _bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(GiB|GB)", str(text))
    if not m:
        raise ValueError(f"accelerators.yaml: bad hbm {text!r}")
    return int(float(m[1]) * (2**30 if m[2] == "GiB" else 10**9))


def _networking(name: str, data: dict[str, Any]) -> Networking:
    known = {"networks", "annotations", "tolerations", "volumes", "sidecars", "mounts", "env", "env_profile",
             "env_fallback"}
    if set(data) - known:
        raise ValueError(f"accelerators.yaml: networking {name}: unknown keys {sorted(set(data) - known)}")
    where = f"accelerators.yaml networking.{name}"
    return Networking(
        name=name,
        networks=tuple(data.get("networks", ())),
        annotations={str(k): str(v) for k, v in (data.get("annotations") or {}).items()},
        tolerations=tuple(t.from_dict(t.Toleration, x, f"{where}.tolerations") for x in data.get("tolerations", ())),
        volumes=tuple(t.from_dict(t.Volume, x, f"{where}.volumes") for x in data.get("volumes", ())),
        sidecars=tuple(t.from_dict(t.Container, x, f"{where}.sidecars") for x in data.get("sidecars", ())),
        mounts=tuple(t.from_dict(t.VolumeMount, x, f"{where}.mounts") for x in data.get("mounts", ())),
        env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
        env_profile=str(data.get("env_profile") or ""),
        env_fallback=_fallback(where, data),
    )


def _fallback(where: str, data: dict[str, Any]) -> dict[str, str]:
    """env_fallback: needs an env_profile, and no name the stack's env sets too."""
    fallback = {str(k): str(v) for k, v in (data.get("env_fallback") or {}).items()}
    if fallback and not data.get("env_profile"):
        raise ValueError(f"{where}: env_fallback without env_profile")
    both = sorted(set(fallback) & set(data.get("env") or {}))
    bad = [k for k in fallback if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or "\n" in fallback[k]]
    if both or bad:
        raise ValueError(f"{where}: env_fallback names {both or bad} (in env too, or not one-line NAME=value)")
    return fallback


@functools.cache
def networking() -> dict[str, Networking]:
    """Every GPU networking stack of the table, by name."""
    table = yaml.safe_load(_TABLE.read_text())
    return {name: _networking(name, data) for name, data in (table.get("networking") or {}).items()}


@functools.cache
def shapes() -> dict[str, Shape]:
    table = yaml.safe_load(_TABLE.read_text())
    stacks = networking()
    out: dict[str, Shape] = {}
    for family, fam in table["families"].items():
        for name, s in fam["shapes"].items():
            out[name] = Shape(
                name=name,
                kind=fam["kind"],
                family=family,
                gke_accelerator=fam["gke_accelerator"],
                topology=s.get("topology", ""),
                vms=int(s["vms"]),
                devices_per_vm=int(s.get("devices_per_vm", fam["devices_per_vm"])),
                peak_bf16_tflops=float(fam["peak_bf16_tflops"]),
                hbm_bytes=_bytes(fam["hbm"]),
                machine_type=s.get("machine_type", fam.get("machine_type", "")),
                nics=int(fam.get("nics", 0)),
                networking=stacks[fam["networking"]] if fam.get("networking") else None,
                jax_devices_per_chip=int(fam.get("jax_devices_per_chip", 1)),
            )
    return out


def cpu_shape(hosts: int, devices_per_host: int = 2) -> Shape:
    return Shape(
        name=f"cpu-{hosts}", kind="cpu", family="cpu", gke_accelerator="", topology="",
        vms=hosts, devices_per_vm=devices_per_host, peak_bf16_tflops=0.0, hbm_bytes=0,
    )


def lookup(name: str, cpu_devices_per_host: int = 2) -> Shape:
    """The shape called ``name``; unknown names raise with the close matches listed."""
    m = _CPU_RE.match(name)
    if m and 1 <= int(m[1]) <= MAX_CPU_HOSTS:
        return cpu_shape(int(m[1]), cpu_devices_per_host)
    table = shapes()
    if name in table:
        return table[name]
    names = sorted(table) + ["cpu-N"]
    close = difflib.get_close_matches(name, names, n=4, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(names)}"
    if m:
        hint = f"cpu hosts must be 1..{MAX_CPU_HOSTS}"
    raise UnknownAccelerator(f"unknown accelerator {name!r}; {hint}")
