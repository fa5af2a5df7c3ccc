"""GCS's JSON API with the standard library only, and the backoff every retry of xrun's pod
side uses: one copy shared by the pod bootstrap (``manifests.podcode``, which embeds this
module's source), ``xrun_contract.gcs_http`` and the log shipper (``workload.sidecar``).

Self-contained on purpose: it imports nothing of xrun's, so the bootstrap can run it in a
pod that holds nothing of xrun's yet. Credentials: none against ``STORAGE_EMULATOR_HOST``
(tests); otherwise an OAuth token from the metadata server (``GCE_METADATA_HOST`` or
``metadata.google.internal``), as google-auth gets one in a pod. The URLs are those of the
GCS JSON API reference (objects get/insert/list, ``alt=media``, ``uploadType=media``).
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse

GCS_API = "https://storage.googleapis.com"
METADATA_TOKEN = "/computeMetadata/v1/instance/service-accounts/default/token"


class Backoff:
    """The waits between tries of one call: ``first`` seconds, doubled up to ``cap``, for at
    most ``tries`` tries and within ``seconds`` from now (either may be None: no limit)."""

    def __init__(self, first: float = 0.25, cap: float = 4.0, *, seconds: float | None = None,
                 tries: int | None = None):
        self.delay, self.cap, self.tries = first, cap, tries
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.failures = 0

    def left(self) -> float:
        """Seconds until the deadline (inf without one)."""
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def can_retry(self) -> bool:
        """Whether another try fits after this failure and its wait (counts the failure)."""
        self.failures += 1
        if self.tries is not None and self.failures >= self.tries:
            return False
        return self.deadline is None or time.monotonic() + self.delay <= self.deadline

    def sleep(self) -> None:
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap)

    def wait(self) -> bool:
        """After a failure: sleep and say True when another try fits, else False at once."""
        if not self.can_retry():
            return False
        self.sleep()
        return True


def api_endpoint() -> tuple[str, bool]:
    """(the JSON API's base URL, whether it takes no credentials: the emulator)."""
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if emulator and "://" not in emulator:
        emulator = "http://" + emulator
    return (emulator or GCS_API).rstrip("/"), bool(emulator)


def metadata_token(timeout: float) -> tuple[str, float]:
    """(access token, seconds it lives) from the metadata server, as google-auth asks."""
    import urllib.request  # here: ssl and email with it, 0.08 s of a local root's log shipper

    host = os.environ.get("GCE_METADATA_HOST") or "metadata.google.internal"
    req = urllib.request.Request("http://" + host + METADATA_TOKEN,
                                 headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        answer = json.loads(resp.read())
    return answer["access_token"], float(answer.get("expires_in", 300))


def split_root(root: str) -> tuple[str, str]:
    """``gs://bucket/some/prefix`` -> ("bucket", "some/prefix")."""
    bucket, _, prefix = root[len("gs://"):].partition("/")
    return bucket, prefix.strip("/")


def object_url(api: str, bucket: str, name: str, query: dict[str, str] | None = None) -> str:
    q = "?" + urllib.parse.urlencode(query) if query else ""
    return api + "/storage/v1/b/" + bucket + "/o/" + urllib.parse.quote(name, safe="") + q


def upload_url(api: str, bucket: str, name: str, **extra: str) -> str:
    query = urllib.parse.urlencode({"uploadType": "media", "name": name, **extra})
    return api + "/upload/storage/v1/b/" + bucket + "/o?" + query


def list_url(api: str, bucket: str, query: dict[str, str]) -> str:
    return api + "/storage/v1/b/" + bucket + "/o?" + urllib.parse.urlencode(query)


def read_object(root: str, key: str, timeout: float = 60.0) -> bytes:
    """One read of ``key`` under ``root`` (``gs://...`` or a folder), no retry: the
    bootstrap's fetch. HTTP errors raise ``urllib.error.HTTPError`` (``.code``)."""
    if not root.startswith("gs://"):
        with open(os.path.join(root, key), "rb") as f:
            return f.read()
    import urllib.request  # as metadata_token

    bucket, prefix = split_root(root)
    api, anonymous = api_endpoint()
    headers = {} if anonymous else {"Authorization": "Bearer " + metadata_token(10.0)[0]}
    url = object_url(api, bucket, "/".join(p for p in (prefix, key) if p), {"alt": "media"})
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=timeout) as resp:
        return resp.read()
