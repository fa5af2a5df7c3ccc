"""The JobSet ``xrun doctor`` runs to prove a pod on the target node pool can write storage.

Rendered from the run's own RunSpec by ``manifests.jobset.build`` and then cut down, so the
pod lands where the run's pods would and talks to GCS as they would: the same nodeSelector
(accelerator, topology, machine type), tolerations, hostNetwork and dnsPolicy, service
account and priority class, image and storage env. Cut: one slice of one pod, no
accelerator request (the probe must not wait for chips a running job holds, nor trigger
GKE's TPU env injection), no ports (hostNetwork ports could clash with a running job), no
restarts, no exclusive-topology annotation, a short TTL. Its command is ``python3 -m workload.probe``
(xrun_image), or the pod-code bootstrap's ``probe`` (manifests.podcode). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

from manifests import types as t
from manifests.jobset import (
    POD_VOLUME,
    build,
    check_no_empty,
    default_pull_policy,
    pod_code_env,
    uses_pod_code,
    xrun_image_of,
)
from manifests.podcode import boot_argv
from manifests.spec import RunSpec
from xrun_contract.k8s import Labels

PROBE_PREFIX = "xrun-doctor-"
PROBE_COMMAND = ["python3", "-m", "workload.probe"]
PROBE_TTL_SECONDS = 600
PROBE_GRACE_SECONDS = 5


def probe_name(spec: RunSpec, salt: str) -> str:
    """A short DNS-1035 name (pod names stay far below 63 characters)."""
    return PROBE_PREFIX + hashlib.sha256(f"{spec.name}/{salt}".encode()).hexdigest()[:8]


def probe_jobset(spec: RunSpec, name: str) -> dict[str, Any]:
    """The probe JobSet for ``spec``'s pod settings, named ``name``."""
    probe = dataclasses.replace(spec, name=name, num_slices=1, nodes=1, max_restarts=0,
                                ttl_seconds_after_finished=PROBE_TTL_SECONDS,
                                termination_grace_seconds=PROBE_GRACE_SECONDS,
                                command=" ".join(PROBE_COMMAND), queue="", kueue_priority="")
    js = build(probe)
    js.metadata.labels = {**(js.metadata.labels or {}), Labels.MANAGED_BY: "xrun-doctor"}
    # No exclusive placement: it would keep the probe off a node pool a running job holds.
    js.metadata.annotations = {}
    rj = js.spec.replicated_jobs[0]
    rj.replicas = 1
    job = rj.template.spec
    job.parallelism = job.completions = 1
    job.pod_failure_policy = None
    pod = job.template.spec
    # The probe's own command prints its one line; no launcher or log shipper is needed.
    pod.init_containers = []
    container = pod.containers[0]
    container.command = list(PROBE_COMMAND)
    if uses_pod_code(spec):  # the public python image: the bootstrap unpacks into the emptyDir
        container.command = boot_argv("probe")
        container.env = [*(container.env or []), *pod_code_env(spec)]
    else:
        pod.volumes = [v for v in pod.volumes if v.name != POD_VOLUME]
        container.volume_mounts = [m for m in container.volume_mounts if m.name != POD_VOLUME]
    # xrun's own containers' image runs the probe (the run's image may be MaxText's, with no
    # xrun code); what is probed is the node's identity and scopes, which every image on it
    # shares.
    container.image = xrun_image_of(spec)
    container.image_pull_policy = default_pull_policy(container.image)
    container.resources = None
    container.ports = []
    # No GPU networking daemons (they need the GPUs the probe does not request) and no
    # flex-start suspension (nothing would admit a probe outside Kueue).
    pod.init_containers = []
    js.spec.suspend = None
    js.spec.failure_policy = t.FailurePolicy(max_restarts=0)
    out = t.to_dict(js)
    check_no_empty(out)
    return out
