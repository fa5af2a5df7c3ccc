"""Offline admission: every manifest xrun renders is one a cluster admits, and each rule
refuses exactly what its upstream counterpart refuses (manifests/admission/)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from manifests import admission, catalogue
from manifests.admission import AdmissionError, check, default, violations
from manifests.jobset import FAIL_ON_USER_ERROR_RULE, jobset
from manifests.spec import TOPOLOGY_AWARE_SCHEDULER, build_spec, topology_gate

SHAPES = sorted(catalogue.shapes()) + ["cpu-1", "cpu-4"]
OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "all-options": {
        "service_account": "trainer", "priority_class": "high-priority", "queue": "team-a",
        "kueue_priority": "prod", "privileged": True, "max_restarts": 0,
        "env": {"PRICE": "$5 and $(HOME)", "EMPTY": "", "XRUN_TEST_STEP_DELAY": "0.5"},
        "restartable_exit_codes": [137, 42, 143],
    },
    "gke-knobs": {
        "queue": "team-a", "priority": "very-high", "node_selector": {"example.com/pool": "a"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoExecute",
                         "toleration_seconds": 30}, {"operator": "Exists"}],
        "pod_labels": {"team": "ml"}, "pod_annotations": {"example.com/owner": "ana"},
        "mounts": [{"bucket": "training-data", "path": "/data", "read_only": True}, {"pvc": "datasets", "path": "/ds"}],
        "scheduler": "gke.io/topology-aware-auto", "kueue_topology": "preferred:cloud.google.com/gce-topology-block",
    },
}


def with_coordinator(o: dict[str, Any]) -> dict[str, Any]:
    """JobSet's optional coordinator (xrun renders none: see the 26-character test)."""
    o["spec"].setdefault("coordinator", {"replicatedJob": "slice", "jobIndex": 0, "podIndex": 0})
    return o


def render(accelerator: str, count: int = 1, name: str = "mt-07-eval", **extra: Any) -> dict[str, Any]:
    kind = catalogue.lookup(accelerator).kind
    values: dict[str, Any] = {"name": name, "accelerator": accelerator, "image": "example.com/xrun:1", **extra}
    if kind != "gpu" and values.get("scheduler") == TOPOLOGY_AWARE_SCHEDULER:
        del values["scheduler"]  # GPU only, as xpk (spec.validate refuses it elsewhere)
    if kind == "tpu":
        values["num_slices"] = count
    elif kind == "gpu":
        values["nodes"] = count
    return jobset(build_spec(values, {}, storage_default="/tmp/xrun-test-storage"))


def test_the_failure_rule_name_is_one_the_webhook_admits():
    assert admission.failure_policy_rule_names(
        {"spec": {"failurePolicy": {"rules": [{"name": FAIL_ON_USER_ERROR_RULE}]}}}) == []


# Single slice and multislice for multi-host TPU shapes (GKE runs no multislice of
# single-host slices: spec.validate refuses it), one and several nodes for GPU shapes.
MATRIX = [(s, n) for s in SHAPES for n in (
    (1,) if s.startswith("cpu") or (catalogue.lookup(s).kind == "tpu" and catalogue.lookup(s).single_host) else (1, 4))]


@pytest.mark.parametrize("option", sorted(OPTIONS))
@pytest.mark.parametrize(("shape", "count"), MATRIX)
def test_every_rendered_jobset_is_admitted(shape, count, option):
    obj = render(shape, count, **OPTIONS[option])
    assert violations(obj) == []
    check(obj)


# --- one rule broken at a time ---------------------------------------------------------

def base() -> dict[str, Any]:
    """A valid multislice TPU JobSet with every option set: hostNetwork, tolerations,
    nodeSelector, extended resources, two ports, the podFailurePolicy."""
    return render("v6e-16", 2, name="abc", **OPTIONS["all-options"])


def pod(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def ctr(obj: dict[str, Any]) -> dict[str, Any]:
    return pod(obj)["containers"][0]


def job(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["replicatedJobs"][0]["template"]["spec"]


def rule0(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["failurePolicy"]["rules"][0]


def on_exit(obj: dict[str, Any]) -> dict[str, Any]:
    return job(obj)["podFailurePolicy"]["rules"][0]["onExitCodes"]


def second_rjob(obj: dict[str, Any], **fields: Any) -> None:
    rj = copy.deepcopy(obj["spec"]["replicatedJobs"][0])
    rj.update(name="late", **fields)
    obj["spec"]["replicatedJobs"].append(rj)


def rename(obj: dict[str, Any], name: str, subdomain: bool = True) -> None:
    obj["metadata"]["name"] = name
    if subdomain:
        obj["spec"]["network"]["subdomain"] = name


RJ0 = "spec.replicatedJobs[0]"
POD = f"{RJ0}.template.spec.template.spec"
C0 = f"{POD}.containers[0]"
PFP = f"{RJ0}.template.spec.podFailurePolicy.rules[0]"
Break = Callable[[dict[str, Any]], Any]

# (rule id, how to break the base, the path reported, the only violation?)
CASES: list[tuple[str, Break, str, bool]] = [
    # apiserver on the JobSet: metadata and CRD schema
    ("object-name", lambda o: rename(o, "Abc", subdomain=False), "metadata.name", False),
    ("label-key", lambda o: o["metadata"]["labels"].update({"bad key!": "x"}), "metadata.labels[bad key!]", True),
    ("label-value", lambda o: job(o)["template"]["metadata"]["labels"].update({"xrun.dev/run": "x" * 64}),
     f"{RJ0}.template.spec.template.metadata.labels[xrun.dev/run]", True),
    ("annotation-key", lambda o: o["metadata"]["annotations"].update({"-bad": "1"}),
     "metadata.annotations[-bad]", True),
    ("annotation-size", lambda o: o["metadata"]["annotations"].update({"big": "x" * 300_000}),
     "metadata.annotations", True),
    ("success-policy-operator", lambda o: o["spec"]["successPolicy"].update(operator="Some"),
     "spec.successPolicy.operator", True),
    ("startup-policy-order", lambda o: o["spec"].update(startupPolicy={"startupPolicyOrder": "Random"}),
     "spec.startupPolicy.startupPolicyOrder", True),
    ("restart-strategy", lambda o: o["spec"]["failurePolicy"].update(restartStrategy="Rolling"),
     "spec.failurePolicy.restartStrategy", True),
    ("failure-rule-action", lambda o: rule0(o).update(action="Fail"), "spec.failurePolicy.rules[0].action", True),
    # Enums without omitempty: the mutating webhook writes an absent one back as "".
    ("failure-rule-action", lambda o: rule0(o).pop("action"), "spec.failurePolicy.rules[0].action", True),
    ("success-policy-operator", lambda o: o["spec"]["successPolicy"].pop("operator"),
     "spec.successPolicy.operator", True),
    ("startup-policy-order", lambda o: o["spec"].update(startupPolicy={}), "spec.startupPolicy.startupPolicyOrder",
     True),
    ("depends-on-status", lambda o: second_rjob(o, dependsOn=[{"name": "slice", "status": "Done"}]),
     "spec.replicatedJobs[1].dependsOn[0].status", True),
    ("replicated-job-unique",
     lambda o: o["spec"]["replicatedJobs"].append(copy.deepcopy(o["spec"]["replicatedJobs"][0])),
     "spec.replicatedJobs[1]", True),
    ("ttl-minimum", lambda o: o["spec"].update(ttlSecondsAfterFinished=-1), "spec.ttlSecondsAfterFinished", True),
    ("startup-policy-depends-on", lambda o: (o["spec"].update(startupPolicy={"startupPolicyOrder": "InOrder"}),
                                             second_rjob(o, dependsOn=[{"name": "slice", "status": "Ready"}])),
     "spec", True),
    # JobSet's mutating webhook failing to decode the JobSet
    ("quantity-format", lambda o: ctr(o)["resources"]["limits"].update({"google.com/tpu": "four"}),
     f"{C0}.resources.limits[google.com/tpu]", True),
    ("int32-range", lambda o: o["spec"]["failurePolicy"].update(maxRestarts=2**31), "spec.failurePolicy.maxRestarts",
     True),
    ("int32-range", lambda o: on_exit(o)["values"].append(2**32), f"{PFP}.onExitCodes.values[3]", True),
    # JobSet validating webhook
    ("failure-rule-name", lambda o: rule0(o).update(name="fail-on-user-error"),
     "spec.failurePolicy.rules[0].name", True),
    ("failure-rule-name-length", lambda o: rule0(o).update(name="A" * 129), "spec.failurePolicy.rules[0].name", True),
    ("failure-rule-name-unique", lambda o: o["spec"]["failurePolicy"]["rules"].append(copy.deepcopy(rule0(o))),
     "spec.failurePolicy.rules[1].name", True),
    ("failure-rule-target", lambda o: rule0(o).update(targetReplicatedJobs=["workers"]),
     "spec.failurePolicy.rules[0].targetReplicatedJobs[0]", True),
    ("failure-rule-reason", lambda o: rule0(o).update(onJobFailureReasons=["OOMKilled"]),
     "spec.failurePolicy.rules[0].onJobFailureReasons[0]", True),
    ("success-policy-target", lambda o: o["spec"]["successPolicy"].update(targetReplicatedJobs=["slice", "ghost"]),
     "spec.successPolicy.targetReplicatedJobs[1]", True),
    ("network-subdomain", lambda o: o["spec"]["network"].update(subdomain="sub.domain"),
     "spec.network.subdomain", True),
    ("group-name", lambda o: o["spec"]["replicatedJobs"][0].update(groupName="Group_1"), f"{RJ0}.groupName", True),
    ("job-name", lambda o: (o["spec"]["replicatedJobs"][0].update(name="Slice"),
                            with_coordinator(o)["spec"]["coordinator"].update(replicatedJob="Slice"),
                            o["spec"]["successPolicy"].update(targetReplicatedJobs=["Slice"])),
     f"{RJ0}.name", False),
    ("pod-name", lambda o: rename(o, "p" * 50, subdomain=False), f"{RJ0}.name", True),
    ("coordinator-label", lambda o: rename(with_coordinator(o), "c" * 27), "spec.coordinator", True),
    ("coordinator", lambda o: with_coordinator(o)["spec"]["coordinator"].update(podIndex=99),
     "spec.coordinator.podIndex", True),
    ("replicas-parallelism", lambda o: (o["spec"]["replicatedJobs"][0].update(replicas=2**16),
                                        job(o).update(parallelism=2**16)), f"{RJ0}.replicas", True),
    ("depends-on-first",
     lambda o: o["spec"]["replicatedJobs"][0].update(dependsOn=[{"name": "slice", "status": "Ready"}]),
     f"{RJ0}.dependsOn", True),
    ("depends-on-order", lambda o: second_rjob(o, dependsOn=[{"name": "ghost", "status": "Ready"}]),
     "spec.replicatedJobs[1].dependsOn[0].name", True),
    ("feature-gate", lambda o: o["spec"]["failurePolicy"].update(restartStrategy="InPlaceRestart"),
     "spec.failurePolicy.restartStrategy", True),
    ("feature-gate", lambda o: (rule0(o).update(action="RestartJob", name="bad-name")),
     "spec.failurePolicy.rules[0].action", True),  # the gate error alone, as upstream returns early
    ("managed-by", lambda o: o["spec"].update(managedBy="kueue"), "spec.managedBy", True),
    # Kueue's validating webhook
    ("kueue-queue-name", lambda o: o["metadata"]["labels"].update({"kueue.x-k8s.io/queue-name": ""}),
     "metadata.labels[kueue.x-k8s.io/queue-name]", True),
    # kube-apiserver on the Jobs and pods
    ("job-nonnegative", lambda o: job(o).update(backoffLimit=-1), f"{RJ0}.template.spec.backoffLimit", True),
    ("job-completion-mode", lambda o: job(o).update(completionMode="Sequential"), f"{RJ0}.template.spec.completionMode",
     False),
    ("job-indexed-completions", lambda o: job(o).pop("completions"), f"{RJ0}.template.spec.completions", False),
    ("job-restart-policy", lambda o: pod(o).update(restartPolicy="OnFailure"), f"{POD}.restartPolicy", True),
    ("job-pod-replacement", lambda o: job(o).update(podReplacementPolicy="TerminatingOrFailed"),
     f"{RJ0}.template.spec.podReplacementPolicy", True),
    ("pfp-action", lambda o: job(o)["podFailurePolicy"]["rules"][0].update(action="Kill"), f"{PFP}.action", True),
    ("pfp-action", lambda o: job(o)["podFailurePolicy"]["rules"][0].pop("action"), f"{PFP}.action", True),
    ("pfp-requirement", lambda o: job(o)["podFailurePolicy"]["rules"][0].pop("onExitCodes"), PFP, True),
    ("pfp-operator", lambda o: on_exit(o).update(operator="Between"), f"{PFP}.onExitCodes.operator", True),
    ("pfp-operator", lambda o: on_exit(o).pop("operator"), f"{PFP}.onExitCodes.operator", True),
    ("pfp-container", lambda o: on_exit(o).update(containerName="main"), f"{PFP}.onExitCodes.containerName", True),
    ("pfp-values", lambda o: on_exit(o).update(values=[]), f"{PFP}.onExitCodes.values", True),
    ("pfp-values", lambda o: on_exit(o).update(values=[137, 42]), f"{PFP}.onExitCodes.values", True),
    ("pfp-values", lambda o: on_exit(o).update(operator="In", values=[0, 42]), f"{PFP}.onExitCodes.values[0]", True),
    ("containers", lambda o: pod(o).update(containers=[]), f"{POD}.containers", False),
    ("container-name", lambda o: (ctr(o).update(name="Workload"), on_exit(o).update(containerName="Workload")),
     f"{C0}.name", True),
    ("container-name", lambda o: ctr(o).pop("name"), f"{C0}.name", False),
    ("container-name", lambda o: pod(o)["initContainers"][0].pop("name"), f"{POD}.initContainers[0].name", False),
    ("container-name-unique", lambda o: pod(o).update(initContainers=[{"name": "workload", "image": "x"}]),
     f"{POD}.initContainers[0].name", True),
    ("container-image", lambda o: ctr(o).pop("image"), f"{C0}.image", True),
    ("container-restart-policy", lambda o: pod(o)["initContainers"][1].update(restartPolicy="Sometimes"),
     f"{POD}.initContainers[1].restartPolicy", True),
    ("container-restart-policy", lambda o: ctr(o).update(restartPolicy="Sometimes"), f"{C0}.restartPolicy", True),
    ("container-restart-policy", lambda o: ctr(o).update(restartPolicyRules=[
        {"action": "Restart", "exitCodes": {"operator": "In", "values": [42]}}]), f"{C0}.restartPolicy", True),
    ("container-restart-rules", lambda o: ctr(o).update(restartPolicy="Never", restartPolicyRules=[
        {"action": "Explode", "exitCodes": {"operator": "In", "values": [42]}}]),
     f"{C0}.restartPolicyRules[0].action", True),
    ("image-pull-policy", lambda o: ctr(o).update(imagePullPolicy="Sometimes"), f"{C0}.imagePullPolicy", True),
    ("env-name", lambda o: ctr(o)["env"].append({"name": "A=B", "value": "x"}), f"{C0}.env[-1].name", True),
    ("env-name", lambda o: ctr(o)["env"][1].pop("name"), f"{C0}.env[1].name", True),
    ("env-value-from", lambda o: ctr(o)["env"][0].update(value="x"), f"{C0}.env[0].valueFrom", True),
    ("env-field-ref", lambda o: ctr(o)["env"][0]["valueFrom"]["fieldRef"].update(fieldPath="status.phase"),
     f"{C0}.env[0].valueFrom.fieldRef.fieldPath", True),
    ("env-field-ref", lambda o: ctr(o)["env"][0]["valueFrom"]["fieldRef"].pop("fieldPath"),
     f"{C0}.env[0].valueFrom.fieldRef.fieldPath", True),
    ("port-name", lambda o: ctr(o)["ports"][0].update(name="Coordinator"), f"{C0}.ports[0].name", True),
    ("port-name-unique", lambda o: ctr(o)["ports"][1].update(name="coordinator"), f"{C0}.ports[1].name", True),
    ("port-number", lambda o: ctr(o)["ports"][0].update(containerPort=70000), f"{C0}.ports[0].containerPort", True),
    ("port-number", lambda o: ctr(o)["ports"][0].pop("containerPort"), f"{C0}.ports[0].containerPort", True),
    ("port-protocol", lambda o: ctr(o)["ports"][0].update(protocol="HTTP"), f"{C0}.ports[0].protocol", True),
    ("host-network-port", lambda o: ctr(o)["ports"][0].update(hostPort=9999), f"{C0}.ports[0].hostPort", True),
    ("volume-name", lambda o: (pod(o)["volumes"][0].update(name="Dshm"), ctr(o)["volumeMounts"][0].update(name="Dshm")),
     f"{POD}.volumes[0].name", True),
    ("volume-name-unique", lambda o: pod(o)["volumes"].append({"name": "dshm", "emptyDir": {}}),
     f"{POD}.volumes[2].name", True),
    ("volume-name", lambda o: pod(o)["volumes"][1].pop("name"), f"{POD}.volumes[1].name", False),
    ("volume-source", lambda o: pod(o)["volumes"].append({"name": "extra", "emptyDir": {}, "hostPath": {"path": "/x"}}),
     f"{POD}.volumes[2].hostPath", True),
    ("volume-mount", lambda o: ctr(o)["volumeMounts"][0].update(name="cache"), f"{C0}.volumeMounts[0].name", True),
    ("volume-mount-path", lambda o: ctr(o)["volumeMounts"][0].pop("mountPath"), f"{C0}.volumeMounts[0].mountPath",
     True),
    ("volume-mount-path", lambda o: (pod(o)["volumes"].append({"name": "cache", "emptyDir": {}}),
                                     ctr(o)["volumeMounts"].append({"name": "cache", "mountPath": "/dev/shm"})),
     f"{C0}.volumeMounts[2].mountPath", True),
    ("resource-name", lambda o: ctr(o)["resources"]["limits"].update(gpu="1"), f"{C0}.resources.limits[gpu]", False),
    # Not alone: base() is queued, and Kueue would also find no quota for pods or cpu.
    ("container-resource-name", lambda o: ctr(o)["resources"]["limits"].update(pods="1"),
     f"{C0}.resources.limits[pods]", False),
    ("resource-quantity", lambda o: ctr(o)["resources"]["limits"].update(cpu="-1"),
     f"{C0}.resources.limits[cpu]", False),
    ("resource-integer", lambda o: (ctr(o)["resources"].pop("requests"),
                                    ctr(o)["resources"]["limits"].update({"google.com/tpu": "500m"})),
     f"{C0}.resources.limits[google.com/tpu]", True),
    ("resource-request-equals-limit", lambda o: ctr(o)["resources"]["requests"].update({"google.com/tpu": "2"}),
     f"{C0}.resources.requests[google.com/tpu]", True),
    ("resource-request-equals-limit", lambda o: ctr(o)["resources"].pop("limits"),
     f"{C0}.resources.limits[google.com/tpu]", True),
    ("resource-request-above-limit", lambda o: (ctr(o)["resources"]["requests"].update(cpu="2"),
                                                ctr(o)["resources"]["limits"].update(cpu="1500m")),
     f"{C0}.resources.requests[cpu]", False),
    ("toleration-key", lambda o: pod(o)["tolerations"][0].update(key="bad key"), f"{POD}.tolerations[0].key", True),
    ("toleration-operator", lambda o: pod(o)["tolerations"][0].update(operator="Contains"),
     f"{POD}.tolerations[0].operator", True),
    ("toleration-value", lambda o: pod(o)["tolerations"][0].update(value="x"), f"{POD}.tolerations[0].operator", True),
    ("toleration-effect", lambda o: pod(o)["tolerations"][0].update(effect="NoRun"),
     f"{POD}.tolerations[0].effect", True),
    ("node-selector", lambda o: pod(o)["nodeSelector"].update({"cloud.google.com/gke-tpu-topology": "4x4" * 22}),
     f"{POD}.nodeSelector[cloud.google.com/gke-tpu-topology]", True),
    ("service-account-name", lambda o: pod(o).update(serviceAccountName="Trainer"), f"{POD}.serviceAccountName", True),
    ("priority-class-name", lambda o: pod(o).update(priorityClassName="High_Priority"),
     f"{POD}.priorityClassName", True),
    ("dns-policy", lambda o: pod(o).update(dnsPolicy="ClusterLast"), f"{POD}.dnsPolicy", True),
    # xrun's gate for a 44-character run name: 64 characters after the "/".
    ("scheduling-gate-name", lambda o: pod(o).update(schedulingGates=[{"name": topology_gate("g" * 44)}]),
     f"{POD}.schedulingGates[0]", True),
    ("scheduling-gate-name",
     lambda o: pod(o).update(schedulingGates=[{"name": "example.com/a"}, {"name": "example.com/a"}]),
     f"{POD}.schedulingGates[1]", True),
    # Kueue: the log shipper's old requests, on a queued run (base() has queue: team-a).
    ("kueue-uncovered-resource", lambda o: pod(o)["initContainers"][1].update(resources={"requests": {"cpu": "100m"}}),
     f"{POD}.initContainers[1].resources.requests[cpu]", True),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{i:02d}-{c[0]}" for i, c in enumerate(CASES)])
def test_each_rule_refuses_one_broken_field(case):
    rule, breaks, path, alone = case
    obj = base()
    assert violations(obj) == []
    breaks(obj)
    if "env[-1]" in path:
        path = path.replace("env[-1]", f"env[{len(ctr(obj)['env']) - 1}]")
    found = violations(obj)
    mine = [v for v in found if v.rule == rule]
    assert len(mine) == 1, [v.line() for v in found]
    (v,) = mine
    assert v.path == path
    assert v.source.split(":")[-1] in v.line() and "\n" not in v.line()
    if alone:
        assert found == mine, [x.line() for x in found]
    with pytest.raises(AdmissionError) as err:
        check(obj)
    assert "\n" not in str(err.value) and str(err.value).startswith(found[0].path + ": ")


def test_every_rule_has_a_broken_case_and_cites_upstream():
    """No rule function without a case above that it refuses; every docstring names its
    upstream source."""
    broken = []
    for case in CASES:
        obj = base()
        case[1](obj)
        broken.append(default(obj))
    for rule_fn in admission.RULES:
        assert ".go" in (rule_fn.__doc__ or ""), f"{rule_fn.__name__}: docstring must cite the upstream file"
        assert any(rule_fn(obj) for obj in broken), f"{rule_fn.__name__}: no case breaks it"
        assert rule_fn(default(base())) == []


def test_the_webhook_refusal_reads_as_upstream_writes_it():
    obj = base()
    rule0(obj)["name"] = "fail-on-user-error"
    (v,) = violations(obj)
    assert v.layer == admission.WEBHOOK and v.cause == admission.INTERNAL
    assert v.upstream_error() == (
        "<nil>: Internal error: invalid failure policy rule name 'fail-on-user-error', a failure policy rule name "
        "must start with an alphabetic character, optionally followed by a string of alphanumeric characters or "
        "'_,:', and must end with an alphanumeric character or '_'")
    assert v.line() == ('spec.failurePolicy.rules[0].name: "fail-on-user-error" must match '
                        "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$ (jobset_webhook.go:validateFailurePolicy)")
    obj = base()
    ctr(obj)["ports"][0]["hostPort"] = 9999
    (v,) = violations(obj)
    assert v.upstream_error() == (f"{C0}.ports[0].hostPort: Invalid value: 9999: must match `containerPort` when "
                                  "`hostNetwork` is true")
    obj = base()
    obj["spec"]["replicatedJobs"].append(copy.deepcopy(obj["spec"]["replicatedJobs"][0]))
    obj["spec"]["ttlSecondsAfterFinished"] = -1
    assert [v.upstream_error() for v in violations(obj)] == [
        'spec.replicatedJobs[1]: Duplicate value: map[string]interface {}{"name":"slice"}',
        "spec.ttlSecondsAfterFinished: Invalid value: -1: spec.ttlSecondsAfterFinished in body should be greater "
        "than or equal to 0"]


def test_kueue_sums_requests_as_component_helpers_pod_requests_does():
    """KEP-753's formula (component-helpers resource/helpers.go AggregateContainerRequests),
    with Kueue's limits-as-missing-requests (workload/resources.go
    UseLimitsAsMissingRequestsInPod): containers 1 cpu + the sidecar's 0.5 = 1.5; the init
    container after the sidecar uses 3 + 0.5 = 3.5, which is more: 3.5 cpu. Memory: the
    workload's limit counts as its request (1Gi), plus the overhead."""
    pod_spec = {
        "containers": [{"name": "w", "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}}],
        "initContainers": [
            {"name": "a", "resources": {"requests": {"cpu": "2"}}},
            {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"name": "b", "resources": {"requests": {"cpu": "3"}}},
        ],
        "overhead": {"memory": "64Mi"},
    }
    assert admission.kueue_pod_requests(pod_spec) == {"cpu": 3.5, "memory": 2**30 + 64 * 2**20}
    pod_spec["initContainers"][2]["resources"]["requests"]["cpu"] = "1"  # 1 + 0.5 < 1 + 0.5 + ... : the sum wins
    assert admission.kueue_pod_requests(pod_spec)["cpu"] == 2  # max(1.5, 2, 0.5, 1.5)
    assert admission.kueue_uncovered(pod_spec) == ["cpu", "memory"]
    assert admission.kueue_uncovered({"containers": [{"resources": {"requests": {"cpu": "0"}}}]}) == []


@pytest.mark.parametrize(("shape", "count"), MATRIX)
def test_a_queued_run_requests_only_what_xpks_cluster_queue_covers(shape, count):
    """What Kueue sums for each rendered pod (sidecars included) is the accelerator alone:
    xpk's ClusterQueue covers google.com/tpu or nvidia.com/gpu and nothing else unless made
    with --cpu-limit/--memory-limit, and Kueue never admits a Workload asking for more."""
    obj = render(shape, count, queue="team-a")
    spec = catalogue.lookup(shape)
    want = {"tpu": {"google.com/tpu": spec.devices_per_vm}, "gpu": {"nvidia.com/gpu": spec.devices_per_vm}}
    pod_spec = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert {k: q for k, q in admission.kueue_pod_requests(pod_spec).items() if q} == want.get(spec.kind, {})
    assert admission.kueue_uncovered(pod_spec) == []
    assert admission.kueue_requests(obj) == []


def test_names_longer_than_26_break_the_coordinator_label():
    """JobSet puts ``<name>-slice-0-0.<name>`` in a label (63 max): 26 characters is the
    longest run name a JobSet with a coordinator admits, whatever its shape. That is why
    xrun renders no ``spec.coordinator`` (its workloads get the address from env)."""
    assert "coordinator" not in render("v6e-8", 1, name="n" * 40)["spec"]
    assert violations(render("v6e-8", 1, name="n" * 40)) == []
    ok = with_coordinator(render("v6e-8", 1, name="n" * 26))
    assert violations(ok) == []
    too_long = copy.deepcopy(ok)
    rename(too_long, "n" * 27)
    (v,) = violations(too_long)
    assert v.rule == "coordinator-label" and "65 characters" in v.message


# --- defaulting ------------------------------------------------------------------------

def test_default_is_idempotent_and_keeps_valid_objects_valid():
    for obj in (base(), render("cpu-2"), render("h200-141gb-8", 2)):
        before = copy.deepcopy(obj)
        once = default(obj)
        assert obj == before  # the input is not mutated
        assert default(once) == once
        assert violations(once) == []
        spec = once["spec"]
        assert spec["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
        assert spec["network"] == {**obj["spec"]["network"], "publishNotReadyAddresses": True}
        assert spec["failurePolicy"]["restartStrategy"] == "Recreate"
        assert spec["successPolicy"] == obj["spec"]["successPolicy"]
        (rj,) = spec["replicatedJobs"]
        assert rj["groupName"] == "default"
        assert {p["protocol"] for p in rj["template"]["spec"]["template"]["spec"]["containers"][0]["ports"]} == {"TCP"}


def test_default_fills_what_the_webhook_fills():
    minimal = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "mini"},
        "spec": {"failurePolicy": {"rules": [{"action": "FailJobSet"}, {"name": "", "action": "RestartJobSet"}]},
                 "replicatedJobs": [{"name": "w", "template": {"spec": {"template": {"spec": {
                     "containers": [{"name": "c", "image": "i"}]}}}}}]},
    }
    out = default(minimal)
    spec = out["spec"]
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert [r["name"] for r in spec["failurePolicy"]["rules"]] == ["failurePolicyRule0", "failurePolicyRule1"]
    rj = spec["replicatedJobs"][0]
    assert rj["replicas"] == 1 and rj["template"]["spec"]["completionMode"] == "Indexed"
    assert rj["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure"
    # Indexed with neither completions nor parallelism: the Job API defaults both to 1
    # (SetDefaults_Job) before validating, as kube-apiserver 1.36 does
    # (test_cluster_doctor.py::test_indexed_job_defaults_agree_with_the_server).
    assert violations(minimal) == []
    with_parallelism = copy.deepcopy(minimal)
    with_parallelism["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 2
    assert [v.rule for v in violations(with_parallelism)] == ["job-indexed-completions"]
    assert default(out) == out


@pytest.mark.parametrize("shape", ["v6e-16", "v5p-16", "h200-141gb-8", "cpu-2"])
def test_pods_get_host_ports_equal_to_container_ports_under_host_network(shape):
    """What the apiserver makes of each pod (SetDefaults_Pod): a Pod under hostNetwork must
    have hostPort == containerPort, and the defaulting gives it exactly that."""
    template = pod(render(shape, 2 if not shape.startswith("cpu") else 1))
    created = admission.default_pod(template)
    ports = [p for c in created["containers"] for p in c.get("ports", [])]
    if template.get("hostNetwork"):
        assert ports and all(p["hostPort"] == p["containerPort"] for p in ports)
        assert "hostPort" not in template["containers"][0]["ports"][0]  # the input is not mutated
    else:
        assert all("hostPort" not in p for p in ports)
    res = created["containers"][0].get("resources")
    if res:
        assert res["requests"] == res["limits"]
