"""What the kube backend reads from Kueue about a queued run: its Workload's conditions and
its place in the LocalQueue (the visibility API), at the versions this cluster serves.

Kueue v0.15+ serves Workloads at v1beta2 and v1beta1, older releases v1beta1 only; its
visibility API (aggregated, VisibilityOnDemand) is documented and served first at v1beta2 in
current releases, v1beta1 before (kueue apis/visibility/v1beta2, site "Pending workloads
on-demand"). Each version is read from API discovery once per backend, preferring the newest
xrun knows, so another release neither hides the message nor the position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.backends.kube.state import kueue_message as workload_message
from xrun_contract.errors import EXIT_UNREACHABLE, XrunError
from xrun_contract.k8s import KUEUE_GROUP, KUEUE_VERSION, KueueWorkload, Labels

if TYPE_CHECKING:
    from orchestrator.backends.kube.backend import KubeBackend

VISIBILITY_GROUP = "visibility.kueue.x-k8s.io"
VISIBILITY_VERSIONS = ("v1beta2", "v1beta1")  # newest first
WORKLOAD_VERSIONS = ("v1beta2", "v1beta1")
# The visibility API answers at most ``limit`` pending workloads a call (1,000 when not
# given); a run further back is found by paging with ``offset``, up to this many.
PAGE = 1000
MAX_PENDING_ASKED = 20_000


def _pick(backend: KubeBackend, group: str, known: tuple[str, ...]) -> str:
    """The newest of ``known`` the group serves, else its preferred version; "" when the
    group is not served."""
    entry = backend.api_group(group)
    if entry is None:
        return ""
    served = [v.get("version", "") for v in entry.get("versions") or []]
    return next((v for v in known if v in served), (entry.get("preferredVersion") or {}).get("version", ""))


def versions(backend: KubeBackend) -> tuple[str, str]:
    """(Workload version, visibility version) on this cluster, asked once per backend; a
    discovery that fails falls back to xrun's Workload version and no position."""
    cached = getattr(backend, "_kueue_versions", None)
    if cached is None:
        try:
            cached = (_pick(backend, KUEUE_GROUP, WORKLOAD_VERSIONS) or KUEUE_VERSION,
                      _pick(backend, VISIBILITY_GROUP, VISIBILITY_VERSIONS))
        except XrunError as e:
            if e.exit_code == EXIT_UNREACHABLE:
                return KUEUE_VERSION, ""
            cached = (KUEUE_VERSION, "")
        backend._kueue_versions = cached  # type: ignore[attr-defined]
    return cached


def message(backend: KubeBackend, jobset: dict[str, Any]) -> str:
    """Kueue's word on a suspended, queued JobSet (its Workload's conditions and its place
    in the queue), or ""."""
    meta = jobset.get("metadata") or {}
    if not (meta.get("labels") or {}).get(Labels.QUEUE_NAME) or not meta.get("uid"):
        return ""
    workload_version, _ = versions(backend)
    from kubernetes import client

    custom = client.CustomObjectsApi(backend.api_client)
    try:
        found = backend.call("list", f"workloads.{KUEUE_GROUP}", custom.list_namespaced_custom_object,
                             KUEUE_GROUP, workload_version, backend.namespace, "workloads",
                             label_selector=f"{KueueWorkload.JOB_UID_LABEL}={meta['uid']}")
    except XrunError:  # a hint only: RBAC may hide Workloads
        return ""
    workloads = (found or {}).get("items") or []
    said = next((m for w in workloads if (m := workload_message(w))), "")
    names = {(w.get("metadata") or {}).get("name", "") for w in workloads} - {""}
    position = queue_position(backend, meta["labels"][Labels.QUEUE_NAME], names) if names else ""
    return "; ".join(x for x in (said, position) if x)


def queue_position(backend: KubeBackend, queue: str, workloads: set[str]) -> str:
    """Where a pending Workload stands, from the LocalQueue's ``pendingworkloads``
    (positionInLocalQueue and positionInClusterQueue, 0 = next, with the workloads ahead of
    it), paged past the API's 1,000 a call; "" when the API is not served or hides it."""
    _, version = versions(backend)
    if not version or getattr(backend, "_no_visibility", False):
        return ""
    ns = backend.namespace
    path = f"/apis/{VISIBILITY_GROUP}/{version}/namespaces/{ns}/localqueues/{queue}/pendingworkloads"
    offset = 0
    while offset < MAX_PENDING_ASKED:
        try:
            data = backend.call("get", f"localqueues.{VISIBILITY_GROUP}/pendingworkloads", backend._get_path,
                                path, query=[("limit", str(PAGE)), ("offset", str(offset))], name=queue) or {}
        except XrunError as e:
            if e.exit_code != EXIT_UNREACHABLE and ("not found" in str(e) or "503" in str(e)):
                backend._no_visibility = True  # not served here: do not ask again
            return ""
        items = data.get("items") or []
        for i, item in enumerate(items):
            if (item.get("metadata") or {}).get("name") in workloads:
                return _position(item, offset + i, items[:i], ns, queue)
        if len(items) < PAGE:
            return ""
        offset += PAGE
    return ""


def _position(item: dict[str, Any], index: int, ahead_here: list[dict[str, Any]], ns: str, queue: str) -> str:
    """The line for a Workload at ``index``: the first few ahead on its page named, the rest
    (earlier pages too) counted."""
    shown = [owner_name(w) for w in ahead_here[:5]]
    more = index - len(shown)
    names = f" ({', '.join(shown)}{f' and {more} more' if more > 0 else ''})" if index else ""
    return (f"Kueue queue: {item.get('positionInLocalQueue', index)} ahead in LocalQueue {ns}/{queue}{names}, "
            f"{item.get('positionInClusterQueue', '?')} ahead in its ClusterQueue")


def owner_name(workload: dict[str, Any]) -> str:
    """The JobSet (or other job) a pending Workload stands for, else the Workload's name."""
    meta = workload.get("metadata") or {}
    return next((o.get("name", "") for o in meta.get("ownerReferences") or []), "") or meta.get("name", "?")
