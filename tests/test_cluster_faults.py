"""What the real API server cannot be made to do on demand, injected by a proxy in front of
it (tests/kube_fault_proxy.py): 5xx answers and a slow link. Everything else is the real
kube-apiserver, JobSet and KWOK of tests/cluster/up.sh."""

from __future__ import annotations

import time

import pytest
from cluster_helpers import NAMESPACE, timing, unique
from kube_fault_proxy import KubeFaultProxy

from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend
from xrun_contract.errors import XrunError


@pytest.fixture
def proxy(cluster):
    p = KubeFaultProxy(cluster).start()
    yield p
    p.stop()


def submit_through(proxy, tmp_path, name: str, **kw) -> KubeBackend:
    backend = KubeBackend("xrun-test", NAMESPACE, proxy.kubeconfig(tmp_path / "kubeconfig"), **kw)
    backend.submit(jobset(build_spec({
        "name": name, "accelerator": "v6e-8", "image": "example.com/xrun:1", "backend": "kube",
        "storage": "gs://xrun-bucket/runs", "command": "true", "termination_grace_seconds": 2,
        "xrun_image": "example.com/xrun-workload:1", "pod_annotations": timing(run_s=60)}, {})))
    return backend


def test_the_proxy_is_transparent_and_a_5xx_is_exit_3_naming_the_server(cluster, proxy, tmp_path):
    name = unique("f5")
    backend = submit_through(proxy, tmp_path, name)
    try:
        assert backend.status(name).state in ("Pending", "Running")  # the real JobSet, through the proxy
        proxy.fail(503, 1, "GET", rf"/jobsets/{name}$")
        with pytest.raises(XrunError) as info:
            backend.status(name)
        assert info.value.exit_code == 3, info.value
        assert "failed (503)" in str(info.value) and "fault proxy" in str(info.value)
        assert backend.status(name).state in ("Pending", "Running")  # and after it, the real one
    finally:
        backend.delete(name, wait=False)


def test_a_slow_api_server_is_exit_3_within_the_request_timeout(cluster, proxy, tmp_path):
    name = unique("slow")
    backend = submit_through(proxy, tmp_path, name, request_timeout=(5.0, 1.0))
    try:
        proxy.delay(30.0, rf"/jobsets/{name}$")
        started = time.monotonic()
        with pytest.raises(XrunError) as info:
            backend.status(name)
        took = time.monotonic() - started
        assert info.value.exit_code == 3, info.value
        # Bounded by the 1 s read timeout, tried 3 times in all (urllib3 retries a GET's read
        # timeout), not by the 30 s the server takes.
        assert 2.5 < took < 6, took
    finally:
        proxy.delays.clear()
        backend.delete(name, wait=False)
