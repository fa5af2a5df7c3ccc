"""Validators for rendered objects: the real JobSet CRD schema and strict Kubernetes schemas."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parent.parent
K8S_VERSION = "1.33"  # GKE's regular channel at the time of writing; kubernetes-validate knows it


def crd_path() -> Path:
    """../shared/schemas beside the checkout (XRUN_SCHEMAS overrides)."""
    env = os.environ.get("XRUN_SCHEMAS")
    base = Path(env) if env else REPO.parent / "shared" / "schemas"
    return base / "jobset.x-k8s.io_jobsets.yaml"


@functools.cache
def jobset_validator() -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(crd_path().read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2"]
    schema = version["schema"]["openAPIV3Schema"]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def validate_jobset(obj: dict) -> None:
    """Raise if the JobSet or any embedded Job template is invalid."""
    errors = sorted(jobset_validator().iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        raise AssertionError(f"JobSet schema: {'/'.join(map(str, e.path))}: {e.message}")
    for rj in obj["spec"]["replicatedJobs"]:
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{obj['metadata']['name']}-{rj['name']}-0", **rj["template"].get("metadata", {})},
            "spec": rj["template"]["spec"],
        }
        validate_k8s(job)


def validate_k8s(obj: dict) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
