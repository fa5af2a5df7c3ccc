"""Shared fixtures: fake-gcs-server and the fault proxy on 127.0.0.1, the real control plane."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import signal
import sys
from pathlib import Path
from typing import Any

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
# of one under each test's fresh storage root: a program compiles once per machine (the
# folder is a build cache in ~/.cache, kept between sessions; workload_helpers says how to
# measure cold), not once per test (a cold tiny program: 15-40 s of a loaded 2-core machine;
# warm: ~3 s). What a run computes does not depend on it (the cache holds the same
# executables XLA would build); a test about the cache under a root sets
# XRUN_LOCAL_COMPILATION_CACHE=1 itself, and a test that must see a compile uses a folder of
# its own (workload_helpers.compilation_cache_at).
if "XRUN_LOCAL_COMPILATION_CACHE" not in os.environ:
    from workload_helpers import compilation_cache

    os.environ["XRUN_LOCAL_COMPILATION_CACHE"] = compilation_cache()


# The test processes' own compiles (the in-process workload tests: ~330 s of CPU in a suite
# run) use the same kept cache, through jax.config, never the environment: JAX_* variables
# would reach every subprocess, including the ones that must see a compile. Set the moment
# jax's own import completes (an import hook: most tests import jax in their body), so every
# compile of the worker reads the cache; set at a test's setup instead, the worker's first
# test that imported jax compiled everything uncached: the slowest one, since the slowest
# tests run first (17.8 s of CPU for the fused cross-entropy test, 2-6 s with the cache).
# JAX opens the folder at its first compile after it is set. It still reports a cache hit
# as a compile (/jax/core/compile/backend_compile_duration), which tests that count compiles
# read. Measured: test_workload_units, test_autotune and test_workload_speed_paths took
# 250 s of CPU (-n 2) with the cache cold, 128 s warm with only programs over 0.2 s kept,
# 103 s with all.
def _jax_cache_in_process() -> None:
    from workload_helpers import compilation_cache

    from workload.distributed import use_compilation_cache

    use_compilation_cache(compilation_cache())  # as the hosts do: every program, eager ops too


class _AfterJaxImport(importlib.abc.MetaPathFinder):
    """Runs _jax_cache_in_process once ``import jax`` has executed jax/__init__.py."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "jax":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("jax")
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _jax_cache_in_process()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("XRUN_LOCAL_COMPILATION_CACHE") != "0":
    if "jax" in sys.modules:
        _jax_cache_in_process()
    else:
        sys.meta_path.insert(0, _AfterJaxImport())


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


# --- Parallel runs (pytest-xdist, `--dist loadgroup`, what .ci/test.sh runs) ---------------
# The control plane is one per worker process that asks for it (a session fixture), and a
# test that restarts its API server disturbs only that worker's. The cluster tests took
# ~2,400 s one after another on a loaded machine: two groups of about equal time, each on
# its own worker with its own control plane (a file named nowhere here goes to the second).
CLUSTER_GROUPS = {f"tests/{name}.py": "cluster-a" for name in (
    "test_cluster_logs", "test_cluster_scale", "test_cluster_lifecycle", "test_cluster_kueue",
    "test_real_cluster", "test_cluster_faults", "test_cluster_drills")}


def _group(item: pytest.Item) -> str | None:
    """The xdist group an item must run in, or None where any worker will do.

    Cluster tests go to one of two groups (CLUSTER_GROUPS), so the suite starts two control
    planes. A module-scoped fixture (a shared training run, a MaxText log) is made once per
    worker that runs one of its tests: its module's tests stay together, so it is made
    once."""
    names = item.fixturenames
    if "cluster" in names:
        return CLUSTER_GROUPS.get(item.nodeid.split("::", 1)[0], "cluster-b")
    defs = getattr(item, "_fixtureinfo", None)
    for name in names:
        for fd in (defs.name2fixturedefs.get(name, ()) if defs else ()):
            if fd.scope == "module":
                return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each item's group, and put the grouped items first, largest group first: under
    xdist a group is one unit of work, and the longest unit must start at once for the suite
    to end when its parallel part does."""
    import json

    try:
        base: dict[str, float] = json.loads(BASELINE.read_text())
    except (OSError, ValueError):
        base = {}
    groups: dict[str | None, float] = {}
    for item in items:
        g = _group(item)
        if g is not None:
            item.add_marker(pytest.mark.xdist_group(g))
        groups[g] = groups.get(g, 0.0) + base.get(item.nodeid, 1.0)
        item.stash[_GROUP] = g
    # Longest first (tests/durations.json's seconds): the cluster groups, then the other
    # groups, then single tests, so a two-minute test does not start last.
    rank = {g: (0 if g.startswith("cluster") else 1, -t) for g, t in groups.items() if g is not None}
    items.sort(key=lambda it: rank.get(it.stash[_GROUP], (2, -base.get(it.nodeid, 1.0))))


_GROUP = pytest.StashKey[str | None]()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Fail at once, not twice as slow, where xdist does not honour a group: it marks a
    grouped item by suffixing its nodeid, which pytest 9.2 ignores (it keeps ``_id``), and
    then every worker met a cluster test and started a control plane of its own."""
    if not (hasattr(session.config, "workerinput") and session.config.getvalue("loadgroup")):
        return
    lost = [it.nodeid for it in session.items if it.get_closest_marker("xdist_group") and "@" not in it.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more): "
                                "see pytest's pin in pyproject.toml")


# --- Durations against the committed baseline (tests/durations.json) -----------------------
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--write-durations", metavar="PATH", default=None,
                     help="write each test's seconds (setup+call+teardown) as JSON to PATH "
                          "(the baseline is tests/durations.json)")


_SECONDS: dict[str, float] = {}
BASELINE = REPO / "tests" / "durations.json"
SLOW_NEW_S = 5.0  # a test absent from the baseline that takes longer is named


def _plain_id(nodeid: str) -> str:
    """A nodeid without the ``@group`` xdist adds to a grouped test's (as xdist splits it)."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid = _plain_id(report.nodeid)
    _SECONDS[nodeid] = _SECONDS.get(nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Name the tests that got slow: over twice their baseline and 5 s more, or new and
    over 5 s. Information for a reviewer, never a failure (the machine's load varies)."""
    import json

    if hasattr(config, "workerinput") or not _SECONDS:
        return
    path = config.getoption("--write-durations")
    if path:
        Path(path).write_text(json.dumps({k: round(v, 2) for k, v in sorted(_SECONDS.items())},
                                         indent=0) + "\n")
    try:
        base = json.loads(BASELINE.read_text())
    except (OSError, ValueError):
        return
    slow = sorted(((s, n, base.get(n)) for n, s in _SECONDS.items()
                   if (n in base and s > 2 * base[n] + 5) or (n not in base and s > SLOW_NEW_S)),
                  reverse=True)
    if slow:
        terminalreporter.section("slower than tests/durations.json")
        for s, n, b in slow[:20]:
            was = f"{b:.1f} s" if b is not None else "new"
            terminalreporter.write_line(f"{s:7.1f} s  (baseline {was})  {n}")
