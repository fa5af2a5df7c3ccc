"""One standard-library GCS reader and one backoff (xrun_contract.gcs_rest), shared by the
pod bootstrap (which carries its source), gcs_http and the log shipper."""

from __future__ import annotations

from pathlib import Path

import pytest

from manifests.podcode import BOOTSTRAP
from xrun_contract import gcs_rest

ROOT = Path(__file__).resolve().parents[1]


def test_backoff_doubles_to_its_cap_for_its_tries(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(gcs_rest.time, "sleep", slept.append)
    backoff = gcs_rest.Backoff(1.0, 30.0, tries=8)
    while backoff.wait():
        pass
    assert slept == [1, 2, 4, 8, 16, 30, 30]  # 8 tries: the bootstrap's fetch


def test_backoff_never_sleeps_past_its_deadline(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(gcs_rest.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(gcs_rest.time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    backoff = gcs_rest.Backoff(0.25, 4.0, seconds=5.0)
    waits = 0
    while backoff.wait():
        waits += 1
    assert waits == 4 and now[0] == pytest.approx(103.75)  # 0.25+0.5+1+2; 4 more would pass 105
    assert backoff.left() == pytest.approx(1.25)


def test_the_bootstrap_runs_the_shared_module_and_nobody_keeps_a_copy():
    source = (ROOT / "xrun_contract/gcs_rest.py").read_text()
    body = source.split('"""', 2)[2].strip()
    assert body in BOOTSTRAP and BOOTSTRAP.count("class Backoff") == 1
    ns: dict = {}
    exec(compile(BOOTSTRAP.replace("\nmain()\n", "\n"), "bootstrap", "exec"), ns)  # stdlib only
    assert ns["Backoff"](1.0, 30.0, tries=8).can_retry()
    for path in ("manifests/podcode.py", "xrun_contract/gcs_http.py", "workload/sidecar.py"):
        text = (ROOT / path).read_text()
        for own in ("computeMetadata", "storage.googleapis.com", "/storage/v1/b/", "delay * 2",
                    "STORAGE_EMULATOR_HOST\", "):
            assert own not in text, f"{path} keeps its own {own!r}: use xrun_contract.gcs_rest"
