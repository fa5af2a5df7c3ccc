"""Shared fixtures: a real gcp-storage-emulator on 127.0.0.1, free ports, the repo root."""

from __future__ import annotations

import http.server
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


from orchestrator.backends.local import free_port  # noqa: E402  (after sys.path is set)


@pytest.fixture(scope="session")
def gcs_emulator():
    """Starts gcp-storage-emulator (in memory) and points the GCS client and TensorStore at it.

    Yields the emulator's base URL. Env vars are set for this process and inherited by
    every subprocess the tests start (workload hosts, xrun CLI).
    """
    from gcp_storage_emulator.server import create_server
    from workload_helpers import emulator_checks_preconditions, emulator_sends_generations

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    # In memory mode the emulator re-serialises its whole object index after every write
    # (quadratic in the object count) into a file that is only read at start-up. Skip that
    # bookkeeping: the index itself stays in memory and every request is served as before.
    server._storage._write_config_to_file = lambda: None
    # The emulator's single-threaded HTTPServer listens with a backlog of 5: parallel
    # clients (TensorStore, several hosts) get SYNs dropped and stall a second per retry.
    http.server.HTTPServer.request_queue_size = 128
    emulator_sends_generations()  # as real GCS does; TensorStore's OCDBT writes need it
    emulator_checks_preconditions()  # ifGenerationMatch, as GCS: exclusive submits need it
    server.start()
    url = f"http://127.0.0.1:{port}"
    old = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")}
    os.environ["STORAGE_EMULATOR_HOST"] = url
    os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
    try:
        yield url
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_bucket_counter = iter(range(10_000))


@pytest.fixture
def gcs_bucket(gcs_emulator) -> str:
    """A fresh, empty bucket on the emulator; yields its gs:// URL."""
    from xrun_contract.storage import gcs_client

    name = f"xrun-test-{os.getpid()}-{next(_bucket_counter)}"
    gcs_client().create_bucket(name)
    return f"gs://{name}"


@pytest.fixture
def api():
    """The scripted Kubernetes API server (tests/kube_api.py) on 127.0.0.1."""
    from kube_api import KubeAPI

    server = KubeAPI().start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(api, tmp_path) -> str:
    """A kubeconfig whose context 'test-ctx' points at the scripted API server."""
    return str(api.kubeconfig(tmp_path / "kubeconfig"))


@pytest.fixture
def gcs_proxy(gcs_emulator):
    """A fault proxy (tests/gcs_proxy.py) in front of the emulator: throttle, outages,
    injected errors. Clients use ``proxy.url`` / ``proxy.env()``; it stops after the test
    (and by itself after 10 minutes at most)."""
    from gcs_proxy import GCSProxy

    proxy = GCSProxy(gcs_emulator, lifetime_s=600).start()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """The real control plane (tests/cluster/up.sh): etcd, kube-apiserver, the controller
    manager and scheduler, JobSet, Kueue and KWOK nodes shaped like GKE node pools. One per
    test session, stopped by down.sh at the end, and by itself if this process dies."""
    from cluster_helpers import start, stop

    root = tmp_path_factory.mktemp("cluster")
    c = start(root, owner=os.getpid())
    try:
        yield c
    finally:
        stop(root)
