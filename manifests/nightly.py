"""The nightly as Kubernetes objects: CronJob, ServiceAccount, Role, RoleBinding, ConfigMap.

Pure: a :class:`CronJobSpec` in, plain dicts out (``xrun nightly --render-cronjob`` dumps
them with PyYAML). The CronJob's pod runs ``xrun nightly -f /etc/xrun/nightly.yaml``; the
ConfigMap carries that file and an in-cluster kubeconfig (the pod's service-account token),
because xrun's cluster backend reads a kubeconfig. The Role grants only what the cluster
backend calls: JobSets create/get/list/watch/delete; pods, pods/log and events
get/list/watch. ``concurrencyPolicy: Forbid`` keeps two nightlies off the same slice, and
``backoffLimit: 0`` because a regression exits 1 on purpose: the failed Job is the alert.

A nightly built from git (``repo:``) needs a checkout where ``xrun nightly`` runs, since
that process packs each branch's worktree and uploads it (the training pods clone nothing
and hold no git credentials). In the CronJob, an init container of the CronJob's image
(which then needs git) clones ``git_url`` into an emptyDir, with a read-only deploy key from
the Secret ``git_secret`` (``kubectl create secret generic NAME --from-file=ssh-privatekey=KEY``)
when given; the nightly runs with ``--repo`` pointing there. The other way: a CI job that
checks the repository out and runs ``xrun nightly``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

CONFIG_DIR = "/etc/xrun"
NIGHTLY_FILE = "nightly.yaml"
KUBECONFIG_FILE = "kubeconfig"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
REPO_DIR = "/work/repo"  # the CronJob's clone, with repo: (an emptyDir at /work)
GIT_KEY_DIR = "/etc/xrun-git"  # the deploy key Secret, read-only
GIT_KEY_FILE = "ssh-privatekey"
WORKLOAD_IDENTITY_ANNOTATION = "iam.gke.io/gcp-service-account"
MANAGED_BY = {"app.kubernetes.io/managed-by": "xrun", "app.kubernetes.io/component": "nightly"}

JOBSET_GROUP = "jobset.x-k8s.io"
RBAC_RULES: list[dict[str, Any]] = [
    {"apiGroups": [JOBSET_GROUP], "resources": ["jobsets"],
     "verbs": ["create", "get", "list", "watch", "delete"]},
    {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": ["get", "list", "watch"]},
]


@dataclass(frozen=True)
class CronJobSpec:
    name: str  # CronJob name; the other objects derive theirs from it
    namespace: str  # where the CronJob runs and the nightly's JobSets go
    schedule: str  # cron, five fields
    image: str  # an image with the xrun CLI installed
    nightly_yaml: str  # the nightly file, verbatim
    service_account: str
    gcp_service_account: str = ""  # Workload Identity for the gs:// storage root
    time_zone: str = ""  # IANA name; the controller's zone when empty
    active_deadline_seconds: int = 24 * 3600
    suspend: bool = False
    git_url: str = ""  # with repo: what the init container clones (REPO_DIR)
    git_secret: str = ""  # a Secret holding a read-only deploy key (key GIT_KEY_FILE)


def _meta(spec: CronJobSpec, name: str, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": spec.namespace, "labels": dict(MANAGED_BY)}
    meta.update(extra)
    return meta


def in_cluster_kubeconfig(namespace: str) -> dict[str, Any]:
    """A kubeconfig that authenticates with the pod's own service-account token."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "in-cluster", "cluster": {
            "server": "https://kubernetes.default.svc", "certificate-authority": f"{SA_DIR}/ca.crt"}}],
        "users": [{"name": "nightly", "user": {"tokenFile": f"{SA_DIR}/token"}}],
        "contexts": [{"name": "in-cluster", "context": {
            "cluster": "in-cluster", "user": "nightly", "namespace": namespace}}],
        "current-context": "in-cluster",
    }


def config_map(spec: CronJobSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(spec, f"{spec.name}-config"),
        "data": {
            NIGHTLY_FILE: spec.nightly_yaml,
            KUBECONFIG_FILE: yaml.safe_dump(in_cluster_kubeconfig(spec.namespace), sort_keys=False),
        },
    }


def service_account(spec: CronJobSpec) -> dict[str, Any]:
    meta = _meta(spec, spec.service_account)
    if spec.gcp_service_account:
        meta["annotations"] = {WORKLOAD_IDENTITY_ANNOTATION: spec.gcp_service_account}
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta}


def role(spec: CronJobSpec) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(spec, spec.name),
        "rules": [{key: list(values) for key, values in rule.items()} for rule in RBAC_RULES],
    }


def role_binding(spec: CronJobSpec) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(spec, spec.name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": spec.name},
        "subjects": [{"kind": "ServiceAccount", "name": spec.service_account, "namespace": spec.namespace}],
    }


def checkout_container(spec: CronJobSpec) -> dict[str, Any]:
    """Clone the repository the nightly builds its branches from (the CronJob's image, with
    git; a deploy key from the Secret when given, host keys accepted on first use)."""
    env: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = [{"name": "repo", "mountPath": REPO_DIR.rsplit("/", 1)[0]}]
    if spec.git_secret:
        env.append({"name": "GIT_SSH_COMMAND",
                    "value": f"ssh -i {GIT_KEY_DIR}/{GIT_KEY_FILE} -o IdentitiesOnly=yes "
                             "-o StrictHostKeyChecking=accept-new -o UserKnownHostsFile=/tmp/known_hosts"})
        mounts.append({"name": "git-key", "mountPath": GIT_KEY_DIR, "readOnly": True})
    return {"name": "checkout", "image": spec.image,
            "command": ["git", "clone", "--quiet", "--no-single-branch", spec.git_url, REPO_DIR],
            **({"env": env} if env else {}), "volumeMounts": mounts}


def cronjob(spec: CronJobSpec) -> dict[str, Any]:
    command = ["xrun", "nightly", "-f", f"{CONFIG_DIR}/{NIGHTLY_FILE}"]
    mounts = [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True}]
    if spec.git_url:
        command += ["--repo", REPO_DIR]
        mounts.append({"name": "repo", "mountPath": REPO_DIR.rsplit("/", 1)[0]})
    container = {
        "name": "nightly",
        "image": spec.image,
        "command": command,
        "env": [{"name": "KUBECONFIG", "value": f"{CONFIG_DIR}/{KUBECONFIG_FILE}"},
                {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
    }
    volumes: list[dict[str, Any]] = [{"name": "config", "configMap": {"name": f"{spec.name}-config"}}]
    init: list[dict[str, Any]] = []
    if spec.git_url:
        init.append(checkout_container(spec))
        volumes.append({"name": "repo", "emptyDir": {}})
        if spec.git_secret:  # ssh refuses a key others can read
            volumes.append({"name": "git-key", "secret": {"secretName": spec.git_secret, "defaultMode": 0o400}})
    cron_spec: dict[str, Any] = {
        "schedule": spec.schedule,
        "concurrencyPolicy": "Forbid",
        "startingDeadlineSeconds": 3600,
        "successfulJobsHistoryLimit": 7,
        "failedJobsHistoryLimit": 7,
        "suspend": spec.suspend,
        "jobTemplate": {
            "metadata": {"labels": dict(MANAGED_BY)},
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": spec.active_deadline_seconds,
                "template": {
                    "metadata": {"labels": dict(MANAGED_BY)},
                    "spec": {
                        "serviceAccountName": spec.service_account,
                        "restartPolicy": "Never",
                        **({"initContainers": init} if init else {}),
                        "containers": [container],
                        "volumes": volumes,
                    },
                },
            },
        },
    }
    if spec.time_zone:
        cron_spec["timeZone"] = spec.time_zone
    return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": _meta(spec, spec.name), "spec": cron_spec}


def nightly_objects(spec: CronJobSpec) -> list[dict[str, Any]]:
    """Everything `kubectl apply -f` needs, in an order that applies cleanly."""
    return [service_account(spec), role(spec), role_binding(spec), config_map(spec), cronjob(spec)]
