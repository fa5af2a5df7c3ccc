"""``xrun doctor`` says one line per check and never a traceback: a check whose API call
fails in a way nobody foresaw is its own FAIL line and the others still run (issue 51: a
400 reading the probe pod's log ended doctor in a traceback that hid every check it had
passed). In process, with a backend whose every call but the version fails."""

from __future__ import annotations

from typing import Any

import pytest

from manifests.spec import build_spec
from orchestrator.cli import main
from orchestrator.services import doctor
from xrun_contract.errors import XrunError


class BrokenBackend:
    """Answers the version, then fails every other call as an unforeseen client error."""

    host, context_name, namespace, poll_seconds = "https://10.0.0.1", "gke_p_z_c", "default", 0.01

    def server_version(self) -> str:
        return "v1.36.3"

    def __getattr__(self, name: str) -> Any:
        def fail(*_: Any, **__: Any) -> Any:
            raise RuntimeError(f"(400) Reason: Bad Request: {name} went wrong")
        return fail


def test_every_check_is_one_line_and_an_unforeseen_error_is_a_fail_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(doctor, "KubeBackend", lambda *a, **k: BrokenBackend())
    code = main(["doctor", "--tpu", "v6e-8", "--queue", "lq", "--storage", str(tmp_path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = out.splitlines()
    assert [ln.split()[1] for ln in lines] == ["api", "jobset", "jobset-controller", "rbac", "kueue", "priority",
                                               "nodes", "capacity", "storage", "pod-storage"], out
    results = {ln.split()[1]: ln.split()[0] for ln in lines}
    assert results["api"] == "ok" and results["pod-storage"] == "warn"
    for name in ("jobset", "jobset-controller", "kueue", "capacity", "storage"):
        assert results[name] == "FAIL", out
    assert "unexpected RuntimeError: (400) Reason: Bad Request: nodes went wrong" in out
    assert code == 1 and err.strip().splitlines()[-1].startswith("xrun: doctor: ")
    assert "all checks passed" not in err


def test_the_unproven_node_account_names_the_pools_scopes():
    """No probe pod: nothing has shown the node pool can write, and doctor says what decides it."""
    check = doctor.unproven_node_account(build_spec({"name": "a", "accelerator": "v6e-8", "image": "i"}, {},
                                                    storage_default="gs://bkt-a/x").shape)
    assert check.result == "warn" and "gke-default, only reads storage: 403 on every write" in check.detail


class LogLess:
    namespace = "default"

    def pod_log(self, pod: str) -> str:
        raise XrunError(f"pods/log {pod!r}: container \"workload\" in pod is waiting to start: "
                        "PodInitializing (400)", 1)


def test_a_probe_pod_with_no_log_is_one_fail_line_naming_why():
    spec = build_spec({"name": "probe", "accelerator": "v6e-8", "image": "python:3.12-slim"}, {},
                      storage_default="gs://bkt-a/x")
    pod = {"metadata": {"name": "probe-slice-0-0-abcde"}, "status": {
        "phase": "Failed",
        "initContainerStatuses": [{"name": "xrun-init", "state": {"terminated": {"reason": "Error", "exitCode": 1}}}],
        "containerStatuses": [{"name": "workload", "state": {"waiting": {"reason": "PodInitializing"}}}]}}
    check = doctor._probe_verdict(LogLess(), spec, pod, "on v6e")  # type: ignore[arg-type]
    assert (check.name, check.result, check.exit_code) == ("pod-storage", "FAIL", 1)
    assert check.detail.startswith("probe pod probe-slice-0-0-abcde ended Failed with no log (xrun-init terminated "
                                   "Error 1; workload waiting PodInitializing): pods/log"), check.detail


class Namespaced:
    namespace = "team"


@pytest.mark.parametrize(("members", "result"), [
    ([], "FAIL"),
    (["serviceAccount:node-sa@p.iam.gserviceaccount.com"], "FAIL"),
    (["principal://iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p.svc.id.goog/"
      "subject/ns/team/sa/trainer"], "ok"),
    (["serviceAccount:p.svc.id.goog[team/trainer]"], "ok"),
    (None, "warn"),
])
def test_fuse_on_a_tpu_pod_needs_its_ksa_granted_not_the_nodes(members, result):
    """On hostNetwork (TPU) pods the GCS FUSE driver authenticates as the pod's KSA
    (hostNetworkPodKSA): the node account's grant leaves the pod in ContainerCreating."""
    spec = build_spec({"name": "fuse", "accelerator": "v6e-8", "image": "i", "service_account": "trainer",
                       "mounts": [{"bucket": "data-b", "path": "/data", "read_only": True}]}, {},
                      storage_default="gs://bkt-a/x")

    def read_iam(bucket: str) -> list[str]:
        assert bucket == "data-b"
        if members is None:
            raise PermissionError("403 storage.buckets.getIamPolicy")
        return members

    check = doctor.check_fuse_identity(Namespaced(), spec, read_iam)  # type: ignore[arg-type]
    assert (check.name, check.result) == ("fuse-identity", result), check
    if result != "ok":
        assert ("--role=roles/storage.objectViewer --member=principal://iam.googleapis.com/projects/PROJECT_NUMBER/"
                "locations/global/workloadIdentityPools/PROJECT_ID.svc.id.goog/subject/ns/team/sa/trainer"
                ) in check.detail


def test_pod_log_a_400_is_one_xrun_error_line(monkeypatch):
    """What the API server answers for a container that never started (400 BadRequest) was
    a raw ApiException out of ``pod_log``: now one line, exit 1."""
    import json

    from kubernetes.client.exceptions import ApiException

    from orchestrator.backends.kube.backend import KubeBackend

    class Core:
        def read_namespaced_pod_log(self, *_: Any, **__: Any) -> Any:
            e = ApiException(status=400, reason="Bad Request")
            e.body = json.dumps({"kind": "Status", "status": "Failure", "reason": "BadRequest", "code": 400,
                                 "message": 'container "workload" in pod "p" is waiting to start: PodInitializing'})
            raise e

    backend = KubeBackend("ctx", "default")
    monkeypatch.setattr(backend, "_apis", lambda: (None, Core()))
    with pytest.raises(XrunError) as e:
        backend.pod_log("p")
    assert e.value.exit_code == 1 and str(e.value) == (
        "pods/log 'p' rejected by the cluster (400 BadRequest): container \"workload\" in pod \"p\" is waiting to "
        "start: PodInitializing"), e.value
