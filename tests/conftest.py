"""Shared fixtures: fake-gcs-server and the fault proxy on 127.0.0.1, the real control plane."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Started in the background by a script (`nohup pytest &`, `cmd &` without job control), the
# session runs with SIGINT ignored, and every process it starts inherits that: the tests that
# press Ctrl-C on `xrun submit` would see it ignored. A handler of our own is not inherited:
# the children start with SIGINT at its default again.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Every local-backend run of the session (the CLI's and LocalBackend's supervisors) shares one
# JAX compilation cache, the folder the hosts tests/workload_helpers.py starts use, instead
# of one under each test's fresh storage root: a program compiles once per session, not once
# per test (a cold tiny program: 15-40 s of a loaded 2-core machine; warm: ~3 s). What a run
# computes does not depend on it (the cache holds the same executables XLA would build);
# a test about the cache under a root sets XRUN_LOCAL_COMPILATION_CACHE=1 itself.
if "XRUN_LOCAL_COMPILATION_CACHE" not in os.environ:
    from workload_helpers import compilation_cache

    os.environ["XRUN_LOCAL_COMPILATION_CACHE"] = compilation_cache()


@pytest.fixture(scope="session")
def gcs_emulator():
    """Starts fake-gcs-server (tests/fake_gcs.py, in memory) and points the GCS client and
    TensorStore at it.

    Yields the emulator's base URL. Env vars are set for this process and inherited by
    every subprocess the tests start (workload hosts, xrun CLI). Without Go to build the
    binary the tests that need it fail with one line saying what to install.
    """
    from fake_gcs import FakeGCSUnavailable, binary, fake_gcs_server

    try:
        exe, why = binary(), ""
    except FakeGCSUnavailable as e:
        exe, why = None, str(e)
    if why:  # outside the except: one line, no chained traceback
        pytest.fail(why, pytrace=False)
    old = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")}
    try:
        with fake_gcs_server(exe) as url:
            os.environ["STORAGE_EMULATOR_HOST"] = url
            os.environ["TENSORSTORE_GCS_HTTP_URL"] = url
            yield url
    finally:
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
    test session, stopped by down.sh at the end, and by itself if this process dies.
    ``XRUN_TEST_CLUSTER=DIR`` uses the one ``up.sh DIR`` started instead (left running)."""
    from cluster_helpers import Cluster, start, stop

    if os.environ.get("XRUN_TEST_CLUSTER"):  # developing: a cluster already up (up.sh DIR)
        yield Cluster(Path(os.environ["XRUN_TEST_CLUSTER"]))
        return
    root = tmp_path_factory.mktemp("cluster")
    c = start(root, owner=os.getpid())
    try:
        yield c
    finally:
        stop(root)
