"""Offline admission (manifests/admission/, what `xrun render` runs on a laptop) against
the real API server, both ways.

The real verdict on a JobSet is two steps, as on a cluster: the JobSet itself is created
(kube-apiserver's CRD schema, JobSet's and Kueue's webhooks), then the JobSet controller
creates one Job per replicated job, which kube-apiserver validates (a refusal there is a
``JobCreationFailed`` event and no pods). Both are asked here with ``dryRun=All``: the JobSet
as rendered, and each Job as the controller would build it from its template.

- every JobSet xrun renders (every shape, single and multislice, every option) is admitted;
- every refusal of ours is a refusal of the server's, on the same field;
- every refusal of the server's, over a corpus of one-field mutations of a rendered JobSet,
  is a refusal of ours.
"""

from __future__ import annotations

import copy
import json
import re
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
from cluster_helpers import NAMESPACE
from kubernetes.client.exceptions import ApiException
from test_admission import CASES, MATRIX, OPTIONS, base, render

from manifests.admission import KUEUE, default, violations


class Refusal:
    def __init__(self, step: str, status: dict[str, Any], prefix: str = ""):
        self.step, self.status = step, status
        causes = (status.get("details") or {}).get("causes") or []
        self.fields = {prefix + c["field"] for c in causes if c.get("field")}
        self.message = status.get("message", "")

    def __repr__(self) -> str:
        return f"{self.step}: {self.message[:400]}"


def job_from(js: dict[str, Any], index: int) -> dict[str, Any]:
    """The Job the JobSet controller creates for replicated job ``index``, slice 0
    (kubernetes-sigs/jobset pkg/controllers/jobset_controller.go constructJob): the
    template's spec and metadata under the name ``<jobset>-<rjob>-0``."""
    rj = js["spec"]["replicatedJobs"][index]
    tmpl = copy.deepcopy(rj["template"])
    meta = tmpl.get("metadata") or {}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": f"{js['metadata']['name']}-{rj['name']}-0", "namespace": NAMESPACE,
                         "labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {}},
            "spec": tmpl["spec"]}


def _refused(e: ApiException) -> dict[str, Any]:
    """The Status of a refusal, or ``e`` raised again when it is no verdict on the object.
    A 403 is a refusal only when a webhook wrote it: Kueue's validating webhook returns a
    plain aggregate error, which controller-runtime answers as ``admission.Denied`` (403
    Forbidden, ``admission webhook ... denied the request``); any other 403 is RBAC."""
    status = json.loads(e.body) if e.body else {}
    webhook_denial = e.status == 403 and str(status.get("message", "")).startswith("admission webhook ")
    if e.status >= 500 or e.status in (401, 404) or (e.status == 403 and not webhook_denial):
        raise e
    return status


def server_verdict(cluster, obj: dict[str, Any]) -> Refusal | None:
    try:
        cluster.custom.create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", obj, dry_run="All")
    except ApiException as e:
        return Refusal("JobSet", _refused(e))
    # The Jobs go through the generic client: the typed BatchV1Api checks required fields
    # client-side (pydantic) and would refuse a Job before the server sees it, where the
    # controller's Job (built from the typed template) carries "" for them.
    for i, _ in enumerate((obj.get("spec") or {}).get("replicatedJobs") or []):
        try:
            cluster.custom.create_namespaced_custom_object(
                "batch", "v1", NAMESPACE, "jobs", job_from(obj, i), dry_run="All")
        except ApiException as e:
            return Refusal("Job", _refused(e), prefix=f"spec.replicatedJobs[{i}].template.")
    return None


def _case_object(case) -> dict[str, Any]:
    _rule, breaks, _path, _alone = case
    obj = base()
    breaks(obj)
    return obj


@pytest.fixture(scope="module")
def verdicts(cluster) -> dict[tuple, Future]:
    """Every dry-run verdict this module asks the server for, asked once and 16 at a time:
    ~900 objects of 1-3 sequential round trips each took minutes one by one, where the
    server answers many at once. A verdict is the same whenever it is asked (dryRun=All
    persists nothing); an error asking one is raised by the test that reads it."""
    objects: dict[tuple, dict[str, Any]] = {}
    for option in OPTIONS:
        for shape, count in MATRIX:
            objects[("rendered", shape, count, option)] = render(shape, count, **OPTIONS[option])
    for i, case in enumerate(CASES):
        objects[("case", i)] = _case_object(case)
    for mutation_id, obj in MUTATIONS:
        objects[("mutation", mutation_id)] = obj
    with ThreadPoolExecutor(16) as pool:
        return {key: pool.submit(server_verdict, cluster, obj) for key, obj in objects.items()}


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize(("shape", "count"), MATRIX)
def test_every_rendered_jobset_is_admitted_by_the_real_server(verdicts, shape, count, option):
    obj = render(shape, count, **OPTIONS[option])
    assert violations(obj) == []
    assert verdicts[("rendered", shape, count, option)].result() is None


def _norm(path: str) -> str:
    """A field path as the API server spells a pod template's: ``metadata`` is elided
    (ValidateObjectMeta on ``spec.template`` reports ``spec.template.labels``) and a map
    key (``labels[xrun.dev/run]``) names the map."""
    path = path.replace(".metadata.", ".").removeprefix("metadata.")
    return re.sub(r"\[[^\]]*[^0-9\]][^\]]*\]$", "", path)


def same(ours: str, theirs: str) -> bool:
    """Our field is the server's, or inside it: the server names a list item
    (``volumes[2]: Duplicate value``) where we name the item's key field."""
    a, b = _norm(ours), _norm(theirs)
    return a == b or a.startswith(b + ".") or a.startswith(b + "[")


def kueue_refuses(cluster, breaks, ours: list) -> None:
    """Kueue refuses nothing at create: a queued JobSet it cannot fit stays suspended, its
    Workload's QuotaReserved False with the flavor assigner's reason. Broken the same way on
    a shape xpk's queue has a flavor and quota for (v6e-8) and created for real in that
    queue, the reason must name the resource we refuse."""
    from orchestrator.backends.kube.backend import KubeBackend

    name = f"kueue-{abs(hash(ours[0].path)) % 10**6}"
    obj = render("v6e-8", 1, name=name, queue="multislice-queue")
    breaks(obj)
    assert [v.rule for v in violations(obj)] == [v.rule for v in ours]
    cluster.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", obj)
    try:
        backend = KubeBackend("xrun-test", NAMESPACE, cluster.kubeconfig)
        # Kueue's reason is its Workload's QuotaReserved=False message ("Kueue: …"), a moment
        # after the queue position line ("… 0 ahead in its ClusterQueue") can show alone.
        message = cluster.wait("Kueue's reason", lambda: (
            m if "Kueue: " in (m := backend.status(name).message) else None), 60)
        resources = {re.search(r"\[([^\]]+)\]$", v.path)[1] for v in ours}
        assert any(f"resource {r} unavailable in ClusterQueue" in message for r in resources), message
    finally:
        cluster.custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", name)


@pytest.mark.parametrize("case", CASES, ids=[f"{i:02d}-{c[0]}" for i, c in enumerate(CASES)])
def test_every_offline_refusal_is_refused_by_the_real_server_on_that_field(cluster, verdicts, case):
    rule, breaks, path, _alone = case
    obj = _case_object(case)
    ours = [v for v in violations(obj) if v.rule == rule]
    assert ours, rule
    if all(v.layer == KUEUE for v in ours):
        kueue_refuses(cluster, breaks, ours)
        return
    theirs = verdicts[("case", CASES.index(case))].result()
    assert theirs is not None, f"{rule}: we refuse {path}, the real server admits it"
    for v in ours:
        same_field = any(same(mine, field) for mine in (v.path, v.upstream_field)
                         for field in theirs.fields)
        assert same_field or v.upstream_error() in theirs.message, (
            f"{rule}: we refuse {v.path} ({v.upstream_error()}); the server refuses "
            f"{sorted(theirs.fields)}: {theirs.message[:500]}")


# --- the other way: what the server refuses, over one-field mutations ---------------------
def _leaves(obj: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _leaves(v, (*path, k))]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _leaves(v, (*path, i))]
    return [path]


def _get(obj: Any, path: tuple) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def _dotted(path: tuple) -> str:
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else k)
    return out


BAD_STRINGS = ("Bad Value!", "", "x" * 300)


def mutations() -> list[tuple[str, dict[str, Any]]]:
    """Each leaf of a rendered, defaulted JobSet broken one way at a time: a string made
    invalid, empty or long; a number made negative or huge; a field removed."""
    seed = default(base())
    frozen = json.dumps(seed)
    out = []
    for path in _leaves(seed):
        if path[:2] == ("metadata", "namespace") or path[:1] in (("apiVersion",), ("kind",)):
            continue
        value = _get(seed, path)
        variants: list[tuple[str, Any]] = [("removed", None)]
        if isinstance(value, bool):
            pass
        elif isinstance(value, int):
            variants += [("negative", -1), ("huge", 2**40)]
        elif isinstance(value, str):
            variants += [(f"str{i}", s) for i, s in enumerate(BAD_STRINGS)]
        for how, new in variants:
            obj = json.loads(frozen)  # a fresh copy: 10x copy.deepcopy's speed, at collection in every worker
            parent = _get(obj, path[:-1])
            if how == "removed":  # list.pop(index) and dict.pop(key) alike
                parent.pop(path[-1])
            else:
                parent[path[-1]] = new
            out.append((f"{_dotted(path)}:{how}", obj))
    return out


MUTATIONS = mutations()


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_every_real_refusal_is_an_offline_refusal(verdicts, mutation):
    mutation_id, obj = mutation
    theirs = verdicts[("mutation", mutation_id)].result()
    if theirs is None:
        return
    ours = violations(obj)
    assert ours, f"the server refuses ({theirs!r}) what offline admission admits"
