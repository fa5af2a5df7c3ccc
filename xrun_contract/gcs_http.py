"""GCS through its JSON API with the standard library only: what xrun's init step and log
shipper use in a pod whose image is a plain ``python`` (no google-cloud-storage).

``open_storage`` picks it for a ``gs://`` root when google-cloud-storage cannot be imported.
Endpoint, token, URLs and backoff are ``xrun_contract.gcs_rest``'s (the pod bootstrap's
own): none against ``STORAGE_EMULATOR_HOST`` (tests); otherwise an OAuth token from the
metadata server, on GKE the GKE metadata server (Workload Identity: the pod's Kubernetes
service account's principal) or, for a hostNetwork pod (TPU), the node's Compute Engine
metadata server (the node pool's service account and scopes). Transient answers (429, 408,
5xx, resets, timeouts) are retried with backoff within the call's deadline; the rest end
the call at once as a ``StorageError`` sorted like any other (``classify_storage_error``).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from xrun_contract.errors import EXIT_USAGE, XrunError
from xrun_contract.gcs_rest import (
    Backoff,
    api_endpoint,
    list_url,
    metadata_token,
    object_url,
    split_root,
    upload_url,
)
from xrun_contract.storage_base import (
    ObjectInfo,
    Objects,
    Storage,
    StorageError,
    check_key,
    classify_storage_error,
    listing_offset,
    object_name,
    storage_timeout,
)


def _parse_time(text: str) -> float:
    """RFC 3339 (``2026-01-02T15:04:05.123Z``) to unix seconds; 0 when absent or odd."""
    import datetime

    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return 0.0


class GCSHttpStorage(Storage):
    """The calls xrun's pod-side code makes (read, write, create exclusively, list, delete),
    bounded by ``timeout`` seconds each, retries included."""

    def __init__(self, root: str, timeout: float | None = None):
        assert root.startswith("gs://")
        bucket, prefix = split_root(root)
        if not bucket:
            raise XrunError(f"storage: {root!r} names no bucket (gs://bucket/prefix)", EXIT_USAGE)
        self.root = root.rstrip("/")
        self.bucket_name, self.prefix = bucket, prefix
        check_key(self.prefix)
        self.timeout = storage_timeout(timeout)
        self.api, self.anonymous = api_endpoint()
        self._token, self._token_until = "", 0.0

    # -- transport ---------------------------------------------------------------------

    def _auth(self) -> dict[str, str]:
        if self.anonymous:
            return {}
        if time.time() > self._token_until - 60:
            self._token, lives = metadata_token(min(10.0, self.timeout))
            self._token_until = time.time() + lives
        return {"Authorization": f"Bearer {self._token}"}

    def _request(self, what: str, key: str, method: str, url: str, body: bytes | None = None,
                 ok_404: bool = False, ok_412: bool = False) -> tuple[int, bytes]:
        """One call, retried while transient until the deadline: (status, body)."""
        backoff = Backoff(0.25, 4.0, seconds=self.timeout)
        while True:
            try:
                headers = self._auth()
                if body is not None:
                    headers["Content-Type"] = "application/octet-stream"
                req = urllib.request.Request(url, data=body, method=method, headers=headers)
                left = max(1.0, backoff.left())
                with urllib.request.urlopen(req, timeout=min(60.0, left)) as resp:
                    return resp.status, resp.read()
            except urllib.error.HTTPError as e:
                if (e.code == 404 and ok_404) or (e.code == 412 and ok_412):
                    return e.code, b""
                error: BaseException = e
            except (OSError, ValueError, KeyError) as e:  # URLError, resets, timeouts; a bad token answer
                error = e
            fault = classify_storage_error(error)
            if fault.permanent or not backoff.wait():
                raise StorageError(f"storage: {self.url(key)}: cannot {what}: {fault.why} ({error})",
                                   permanent=fault.permanent, why=fault.why,
                                   unreachable=fault.unreachable) from None

    def _name(self, key: str) -> str:
        return object_name(self.prefix, key)

    def _offset(self, start: str) -> str:
        return listing_offset(self.prefix, start)

    def _object_url(self, key: str, query: dict[str, str] | None = None) -> str:
        return object_url(self.api, self.bucket_name, self._name(key), query)

    def _upload_url(self, key: str, **extra: str) -> str:
        return upload_url(self.api, self.bucket_name, self._name(key), **extra)

    # -- Storage -----------------------------------------------------------------------

    def read_bytes(self, key: str) -> bytes | None:
        status, data = self._request("read", key, "GET", self._object_url(key, {"alt": "media"}), ok_404=True)
        return None if status == 404 else data

    def exists_object(self, key: str) -> bool:
        status, _ = self._request("stat", key, "GET", self._object_url(key), ok_404=True)
        return status != 404

    def write_bytes(self, key: str, data: bytes) -> None:
        self._request("write", key, "POST", self._upload_url(key), body=data)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        status, _ = self._request("create", key, "POST", self._upload_url(key, ifGenerationMatch="0"),
                                  body=data, ok_412=True)
        if status == 412:  # ours whose answer was lost, or another creator's
            return self.read_bytes(key) == data
        return True

    def delete_object(self, key: str) -> bool:
        status, _ = self._request("delete", key, "DELETE", self._object_url(key), ok_404=True)
        return status != 404

    listing_cost = 100  # objects: what a request's round trip costs against a page's items

    def _list(self, prefix: str, delimiter: str | None, start: str) -> tuple[list[ObjectInfo], list[str]]:
        name = self._name(prefix)
        name = f"{name}/" if name else ""
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        token = ""
        while True:
            query: dict[str, str] = {"prefix": name}
            if delimiter:
                query["delimiter"] = delimiter
            if start.strip("/"):
                query["startOffset"] = self._offset(start)
            if token:
                query["pageToken"] = token
            _, data = self._request("list", prefix, "GET", list_url(self.api, self.bucket_name, query))
            page: dict[str, Any] = json.loads(data or b"{}")
            for item in page.get("items") or []:
                if not item["name"].endswith("/"):
                    objects.append(ObjectInfo(self._key(item["name"]), int(item.get("size") or 0),
                                              _parse_time(item.get("updated", ""))))
            prefixes += [self._key(p.rstrip("/")) for p in page.get("prefixes") or []]
            token = page.get("nextPageToken") or ""
            if not token:
                break
        objects.sort(key=lambda o: o.key)
        return objects, sorted(prefixes)

    def list(self, prefix: str, delimiter: str | None = "/") -> tuple[list[ObjectInfo], list[str]]:
        return self._list(prefix, delimiter, "")

    def list_from(self, prefix: str, start: str) -> Objects:
        """objects.list's ``startOffset`` (names lexicographically equal to or after it)."""
        return self._list(prefix, None, start)[0]

    def _key(self, name: str) -> str:
        return name[len(self.prefix) + 1:] if self.prefix else name

    def delete_prefix(self, prefix: str) -> int:
        if not check_key(prefix).strip("/"):
            raise XrunError(f"storage: refusing to delete the whole root {self.root}", EXIT_USAGE)
        objects, _ = self.list(prefix, delimiter=None)
        for o in objects:
            self.delete_object(o.key)
        return len(objects)

    def url(self, key: str = "") -> str:
        return f"{self.root}/{key.strip('/')}" if key else self.root
