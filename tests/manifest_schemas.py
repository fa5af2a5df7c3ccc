"""Validators for rendered objects, all from inside the repository.

A JobSet must round-trip through the typed model (``manifests.types``: the v1alpha2 fields
xrun renders, unknown keys and wrong types refused), pass offline admission as a cluster
would (``manifests.admission``: JobSet webhook + API-server rules) and have Job templates
valid under the strict Kubernetes schemas of ``kubernetes-validate``. The upstream JobSet
CRD is a further cross-check run by ``.ci/run`` (``.ci/crosscheck_crd.py``), not a test
dependency: a fresh clone needs nothing outside itself.
"""

from __future__ import annotations

import kubernetes_validate

from manifests import admission
from manifests import types as t

K8S_VERSION = "1.33"  # GKE's regular channel at the time of writing; kubernetes-validate knows it


def validate_jobset(obj: dict) -> None:
    """Raise if the JobSet or any embedded Job template is invalid."""
    typed = t.from_dict(t.JobSet, obj)
    assert t.to_dict(typed) == obj, "the manifest does not round-trip through manifests.types"
    admission.check(admission.default(obj))
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
