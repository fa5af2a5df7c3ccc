"""``xrun doctor``'s storage probe, run inside a pod with a run's pod settings.

It writes one object under the storage root, reads it back and deletes it, and prints one
``xrun probe:`` line with the outcome and the identity the pod used. A TPU pod runs with
``hostNetwork``, where GKE Workload Identity does not apply: GCS sees the node's service
account, limited by the node pool's OAuth scopes. So the probe also asks the metadata server
(what google-auth asks) for that account and its scopes, and prints them, bounded to a
couple of seconds; off GCE they are "unknown". Exit 0 when the round trip worked, 1 when not.
Imports neither jax nor kubernetes.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request

from xrun_contract import PROBE_LINE, Env

METADATA = "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/"


def _metadata(item: str) -> str:
    """The default service account's ``item`` from the metadata server, or "unknown"."""
    host = os.environ.get("GCE_METADATA_HOST")
    url = METADATA.replace("metadata.google.internal", host) if host else METADATA
    try:
        req = urllib.request.Request(url + item, headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.read().decode().strip()
    except Exception:  # noqa: BLE001 - not on GCE, or the metadata server is blocked
        return "unknown"


def main() -> int:
    from xrun_contract.storage import open_storage

    root = os.environ.get(Env.STORAGE, "")
    key = f".xrun-doctor/{os.environ.get(Env.RUN_NAME, 'probe')}/{os.environ.get(Env.POD_NAME, 'pod')}"
    result: dict[str, object] = {"root": root, "key": key,
                                 "account": _metadata("email"),
                                 "scopes": _metadata("scopes").split()}
    try:
        storage = open_storage(root)
        payload = f"xrun doctor probe {time.time()}".encode()
        storage.write_bytes(key, payload)
        back = storage.read_bytes(key)
        storage.delete_prefix(key.rsplit("/", 1)[0])
        result["ok"] = back == payload
        if back != payload:
            result["error"] = "read back something other than what was written"
    except Exception as e:  # noqa: BLE001 - the outcome is the report
        result.update(ok=False, error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}")
    print(PROBE_LINE.format(json=json.dumps(result, sort_keys=True)), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
