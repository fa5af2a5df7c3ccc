"""GKE operator knobs (capacity, placement, priority, mounts, scheduler, Kueue topology):
each renders what GKE/Kueue document, passes admission, and bad values are exit 2 naming
the field. On the real control plane (tests/test_cluster_backend.py) a spot run lands only on
the spot pool and a flex-start run waits suspended for Kueue."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from cli_helpers import xrun

from manifests.admission import violations
from manifests.jobset import jobset
from manifests.spec import build_spec, max_name_length
from xrun_contract.errors import EXIT_USAGE, XrunError

BASE = {"name": "knobs", "accelerator": "v6e-16", "image": "example.com/xrun:1"}
STORAGE = "gs://bucket-a/xrun"


def render(**values: Any) -> dict[str, Any]:
    obj = jobset(build_spec({**BASE, **values}, {}, storage_default=STORAGE))
    assert violations(obj) == []
    return obj


def tmpl(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]


def refused(**values: Any) -> str:
    with pytest.raises(XrunError) as e:
        render(**values)
    assert e.value.exit_code == EXIT_USAGE
    return str(e.value)


def test_spot_selects_and_tolerates_gke_spot_nodes():
    pod = tmpl(render(capacity="spot"))["spec"]
    assert pod["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true",
            "effect": "NoSchedule"} in pod["tolerations"]


def test_reservation_selects_the_named_reservation():
    """The label a Standard pool made with --reservation=NAME carries, nothing more (xpk
    selects it alone; reservation-affinity is not on those nodes)."""
    pod = tmpl(render(capacity="reservation:res-a3-1"))["spec"]
    assert pod["nodeSelector"]["cloud.google.com/reservation-name"] == "res-a3-1"
    assert "cloud.google.com/reservation-affinity" not in pod["nodeSelector"]
    assert "cloud.google.com/reservation-project" not in pod["nodeSelector"]


def test_shared_reservation_names_its_project():
    """A shared reservation's path: the name and the owner project as two labels (a label
    value cannot hold the slashes)."""
    pod = tmpl(render(capacity="reservation:projects/owner-proj-1/reservations/res-a"))["spec"]
    assert pod["nodeSelector"]["cloud.google.com/reservation-name"] == "res-a"
    assert pod["nodeSelector"]["cloud.google.com/reservation-project"] == "owner-proj-1"
    assert refused(capacity="reservation:projects/P/reservations/x").startswith(
        "capacity: 'reservation:projects/P/reservations/x' is not reservation:NAME or")
    assert refused(capacity="reservation:projects/owner-proj-1/res-a").startswith("capacity: ")


def test_flex_start_selects_flex_start_nodes_and_tolerates_queued():
    """GKE labels flex-start nodes gke-flex-start=true and taints queued-provisioning ones
    gke-queued: the pods select the one and tolerate the other. With a queue, Kueue
    (ProvisioningRequest) admits a suspended JobSet; without, plain flex-start."""
    obj = render(accelerator="h200-141gb-8", nodes=2, capacity="flex-start", queue="dws")
    pod = tmpl(obj)["spec"]
    assert obj["spec"]["suspend"] is True and obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "dws"
    assert pod["nodeSelector"]["cloud.google.com/gke-flex-start"] == "true"
    assert "cloud.google.com/gke-queued" not in pod["nodeSelector"]
    assert {"key": "cloud.google.com/gke-queued", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    plain = render(accelerator="v6e-4", capacity="flex-start", queue="none")
    assert "suspend" not in plain["spec"] and "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]
    assert tmpl(plain)["spec"]["nodeSelector"]["cloud.google.com/gke-flex-start"] == "true"


def test_multislice_required_topology_is_per_slice():
    """One PodSet holds every slice's pods: required at a level for all of them never fits
    (each slice is its own node pool), so each slice of hosts_per_slice pods is required
    there (Kueue's podset-slice-required-topology + podset-slice-size)."""
    level = "cloud.google.com/gce-topology-block"
    one = tmpl(render(queue="lq", kueue_topology=f"required:{level}"))["metadata"]["annotations"]
    assert one == {"kueue.x-k8s.io/podset-required-topology": level}
    two = tmpl(render(queue="lq", num_slices=2, kueue_topology=f"required:{level}"))["metadata"]["annotations"]
    assert two == {"kueue.x-k8s.io/podset-slice-required-topology": level, "kueue.x-k8s.io/podset-slice-size": "4"}
    pref = tmpl(render(queue="lq", num_slices=2, kueue_topology=f"preferred:{level}"))["metadata"]["annotations"]
    assert pref == {"kueue.x-k8s.io/podset-preferred-topology": level}


@pytest.mark.parametrize("accelerator", ["v6e-32", "v5p-16", "h100-80gb-8", "h100-mega-80gb-8", "h200-141gb-8",
                                         "b200-8"])
@pytest.mark.parametrize("capacity", ["on-demand", "spot", "reservation:res-1", "flex-start",
                                      "reservation:projects/proj-b/reservations/res-2"])
def test_every_capacity_on_every_family_is_admitted(accelerator, capacity):
    render(accelerator=accelerator, capacity=capacity, queue="lq")


@pytest.mark.parametrize(("value", "message"), [
    ("preemptible", "capacity: must be one of on-demand | spot | reservation:<name> | flex-start, got 'preemptible'"),
    ("reservation:Bad_Name", "capacity: reservation name 'Bad_Name' is not a Compute Engine name"),
])
def test_bad_capacity(value, message):
    assert refused(capacity=value).startswith(message)


def test_placement_merges_and_conflicts_name_both_sides():
    obj = render(node_selector={"pool": "a", "cloud.google.com/gke-tpu-topology": "4x4"},
                 tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
                              {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
                 pod_labels={"team": "ml"}, pod_annotations={"example.com/owner": "ana"})
    t = tmpl(obj)
    assert t["spec"]["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice",
                                         "cloud.google.com/gke-tpu-topology": "4x4",
                                         "node.kubernetes.io/instance-type": "ct6e-standard-4t", "pool": "a"}
    assert t["spec"]["tolerations"] == [  # xrun's TPU toleration once, the user's added
        {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    assert t["metadata"]["labels"] == {"xrun.dev/run": "knobs", "team": "ml"}
    assert t["metadata"]["annotations"] == {"example.com/owner": "ana"}
    assert refused(node_selector={"cloud.google.com/gke-tpu-topology": "2x2"}) == (
        "node_selector: cloud.google.com/gke-tpu-topology='2x2' conflicts with xrun's "
        "cloud.google.com/gke-tpu-topology='4x4' (from accelerator: v6e-16, capacity: on-demand)")
    assert refused(pod_labels={"xrun.dev/run": "other"}).startswith(
        "pod_labels: xrun.dev/run='other' conflicts with xrun's xrun.dev/run='knobs'")
    assert refused(accelerator="h100-80gb-8",
                   pod_annotations={"networking.gke.io/default-interface": "eth1"}).startswith(
        "pod_annotations: networking.gke.io/default-interface='eth1' conflicts with xrun's "
        "networking.gke.io/default-interface='eth0'")
    assert refused(pod_labels={"jobset.sigs.k8s.io/job-index": "0"}).startswith(
        "pod_labels: 'jobset.sigs.k8s.io/job-index' is set by the JobSet/Job controllers")
    assert refused(node_selector={"bad key!": "x"}).startswith("node_selector: key 'bad key!':")
    assert refused(tolerations=[{"key": "a", "operator": "Exists", "value": "x"}]) == (
        "tolerations[0].value: must be empty with operator Exists")
    assert refused(tolerations=[{"key": "a", "effect": "NoRun"}]).startswith(
        "tolerations[0].effect: must be NoSchedule")


def test_priority_ladder_raw_names_and_both():
    assert tmpl(render(priority="very-high"))["spec"]["priorityClassName"] == "very-high"
    assert tmpl(render(priority="team-a-batch"))["spec"]["priorityClassName"] == "team-a-batch"
    assert tmpl(render(priority_class="legacy"))["spec"]["priorityClassName"] == "legacy"
    assert refused(priority="high", priority_class="legacy").startswith(
        "priority: give priority ('high') or priority_class")
    assert refused(priority="Urgent!").startswith(
        "priority: one of very-low, low, medium, high, very-high or a PriorityClass name")


def test_mounts_gcs_fuse_and_pvc():
    t = tmpl(render(mounts=[{"bucket": "training-data", "path": "/data", "read_only": True, "options": "implicit-dirs"},
                            {"pvc": "datasets", "path": "/datasets"}]))
    # The sidecar unthrottled as xpk sets it (src/xpk/core/storage.py GCS_FUSE_ANNOTATIONS)...
    assert t["metadata"]["annotations"] == {"gke-gcsfuse/volumes": "true", "gke-gcsfuse/cpu-limit": "0",
                                            "gke-gcsfuse/memory-limit": "0",
                                            "gke-gcsfuse/ephemeral-storage-limit": "0"}
    vols = {v["name"]: v for v in t["spec"]["volumes"]}
    # ...and a TPU pod (hostNetwork) uses its service account (gcs-fuse-csi-driver
    # docs/authentication.md: hostNetworkPodKSA).
    assert t["spec"]["hostNetwork"] is True
    assert vols["mount-0"] == {"name": "mount-0", "csi": {
        "driver": "gcsfuse.csi.storage.gke.io", "readOnly": True,
        "volumeAttributes": {"bucketName": "training-data", "mountOptions": "implicit-dirs",
                             "hostNetworkPodKSA": "true"}}}
    assert vols["mount-1"] == {"name": "mount-1", "persistentVolumeClaim": {"claimName": "datasets"}}
    mounts = t["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "mount-0", "mountPath": "/data", "readOnly": True} in mounts
    assert {"name": "mount-1", "mountPath": "/datasets"} in mounts
    assert refused(mounts=[{"bucket": "gs://x", "path": "/d"}]).startswith("mounts[0].bucket: a GCS bucket name")
    assert refused(mounts=[{"bucket": "b-1", "pvc": "c", "path": "/d"}]).startswith("mounts[0]: give exactly one of")
    assert refused(mounts=[{"pvc": "c", "path": "data"}]).startswith("mounts[0].path: an absolute path")
    assert refused(mounts=[{"pvc": "c", "path": "/dev/shm"}]) == (
        "mounts[0].path: /dev/shm is where xrun mounts its volume 'dshm'")


def test_topology_aware_gate_only_on_gpu_and_only_as_long_as_a_qualified_name():
    """xpk gates GPU workloads only (src/xpk/core/scheduling.py get_gpu_scheduler, called for
    AcceleratorType.GPU); the gate gke.io/topology-aware-auto-<name> is a qualified name
    (kubernetes validation.go validateSchedulingGates): 63 characters after the '/', so run
    names of at most 43. A longer one is admitted as a JobSet and then fails every Job
    creation, so render refuses it and offline admission flags the gate."""
    gpu = {"accelerator": "h100-80gb-8", "scheduler": "gke.io/topology-aware-auto"}
    assert refused(scheduler="gke.io/topology-aware-auto") == (
        "scheduler: gke.io/topology-aware-auto is GKE's topology-aware scheduling for GPU node pools "
        "(xpk gates only GPU workloads), not for v6e-16")
    longest = "g" * 43
    gate = tmpl(render(name=longest, **gpu))["spec"]["schedulingGates"][0]["name"]
    assert gate == f"gke.io/topology-aware-auto-{longest}" and len(gate.partition("/")[2]) == 63
    # 44 characters: within the pod-name limit for one GPU node (47), beyond the gate's.
    assert len("g" * 44) <= max_name_length(build_spec({**BASE, **gpu, "name": "x"}, {}, STORAGE))
    assert refused(name="g" * 44, **gpu) == (
        "name: 'gggggggggggggggggggggggggggggggggggggggggggg' is 44 characters; at most 43 with scheduler: "
        "gke.io/topology-aware-auto, so the pod scheduling gate gke.io/topology-aware-auto-<name> stays a "
        "qualified name (at most 63 characters after the '/')")
    # What the old renderer produced for that name: the Job API would refuse the template.
    obj = render(name=longest, **gpu)
    tmpl(obj)["spec"]["schedulingGates"][0]["name"] += "g"
    (v,) = violations(obj)
    assert (v.rule, v.layer, v.path) == (
        "scheduling-gate-name", "job", "spec.replicatedJobs[0].template.spec.template.spec.schedulingGates[0]")
    assert v.upstream_error().endswith("name part must be no more than 63 characters")
    r = xrun("render", "--name", "g" * 44, "--accelerator", "h100-80gb-8", "--image", "i",
             "--scheduler", "gke.io/topology-aware-auto", storage=STORAGE)
    assert r.returncode == EXIT_USAGE and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].startswith("xrun: error: name: ") and "at most 43" in r.stderr


def test_scheduler_and_kueue_topology():
    t = tmpl(render(scheduler="gke.io/topology-aware-auto", accelerator="h100-80gb-8"))
    assert t["spec"]["schedulingGates"] == [{"name": "gke.io/topology-aware-auto-knobs"}]
    assert "schedulerName" not in t["spec"]
    assert tmpl(render(scheduler="my-scheduler"))["spec"]["schedulerName"] == "my-scheduler"
    t = tmpl(render(queue="lq", kueue_topology="required:cloud.google.com/gce-topology-block"))
    assert t["metadata"]["annotations"] == {
        "kueue.x-k8s.io/podset-required-topology": "cloud.google.com/gce-topology-block"}
    assert refused(kueue_topology="preferred:kubernetes.io/hostname") == (
        "kueue_topology: needs queue (Kueue's topology-aware scheduling admits through a LocalQueue)")
    assert refused(queue="lq", kueue_topology="best:x").startswith("kueue_topology: required:<node label> or")


def test_flags_have_the_run_file_names(tmp_path):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump({**BASE, "storage": STORAGE, "node_selector": {"pool": "a"},
                                        "mounts": [{"pvc": "ds", "path": "/ds"}]}))
    r = xrun("render", "-f", str(run_file), "--capacity", "spot", "--node-selector", "zone=b",
             "--tolerations", "dedicated=ml:NoSchedule", "--pod-labels", "team=ml", "--pod-annotations", "a.io/b=c",
             "--priority", "low", "--mounts", "gs://training-data:/data:ro", "--scheduler", "my-scheduler",
             storage=tmp_path)
    assert r.returncode == 0, r.stderr
    pod = tmpl(yaml.safe_load(r.stdout))
    spec = pod["spec"]
    assert spec["nodeSelector"]["pool"] == "a" and spec["nodeSelector"]["zone"] == "b"
    assert spec["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"} in spec["tolerations"]
    assert pod["metadata"]["labels"]["team"] == "ml" and pod["metadata"]["annotations"]["a.io/b"] == "c"
    assert spec["priorityClassName"] == "low" and spec["schedulerName"] == "my-scheduler"
    assert [m["mountPath"] for m in spec["containers"][0]["volumeMounts"]][-2:] == ["/ds", "/data"]
    bad = xrun("render", "-f", str(run_file), "--capacity", "cheap", storage=tmp_path)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "xrun: error: capacity: must be one of on-demand | spot | reservation:<name> | flex-start, got 'cheap'"]


def test_gcs_fuse_on_a_pod_network_pod_has_no_host_network_attribute():
    """A3 Mega pods get their NICs by annotation, without hostNetwork: the driver's default
    Workload Identity path applies and the attribute is left out."""
    t = tmpl(render(accelerator="h100-mega-80gb-8", mounts=[{"bucket": "training-data", "path": "/data"}]))
    assert "hostNetwork" not in t["spec"]
    vol = next(v for v in t["spec"]["volumes"] if v["name"] == "mount-0")
    assert vol["csi"]["volumeAttributes"] == {"bucketName": "training-data"}
    assert t["metadata"]["annotations"]["gke-gcsfuse/memory-limit"] == "0"


def test_image_pull_secrets_from_file_and_flags():
    obj = jobset(build_spec({**BASE, "image_pull_secrets": ["regcred"]},
                            {"image_pull_secrets": ["other-cred"]}, storage_default=STORAGE))
    assert violations(obj) == []
    assert tmpl(obj)["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other-cred"}]
    assert "imagePullSecrets" not in tmpl(render())["spec"]
    assert refused(image_pull_secrets=["Bad_Name"]).startswith("image_pull_secrets[0]: a Secret name")
    assert refused(image_pull_secrets=["a", "a"]) == "image_pull_secrets: a is named twice"


def test_image_pull_secret_flag_is_repeatable(tmp_path):
    r = xrun("render", "--name", "ps", "--accelerator", "v6e-8", "--image", "example.com/i:1",
             "--image-pull-secret", "one", "--image-pull-secret", "two", storage=STORAGE)
    assert r.returncode == 0, r.stderr
    pod = tmpl(yaml.safe_load(r.stdout))["spec"]
    assert pod["imagePullSecrets"] == [{"name": "one"}, {"name": "two"}]


@pytest.mark.parametrize("accelerator,slices", [("v6e-16", 4), ("v5p-16", 2), ("v6e-256", 2)])
def test_multislice_containers_never_name_an_env_var_twice(accelerator, slices):
    """Kubernetes keeps duplicate env entries and the last wins silently; MEGASCALE_* come
    from xrun once (GKE's webhook derives the same values), whatever the user's env says."""
    obj = render(accelerator=accelerator, num_slices=slices,
                 env={"LIBTPU_INIT_ARGS": "--xla_tpu_enable_async_collective_fusion=true", "MY_FLAG": "1"})
    pod = tmpl(obj)["spec"]
    for c in pod["containers"] + pod["initContainers"]:
        names = [e["name"] for e in c.get("env") or []]
        assert len(names) == len(set(names)), (c["name"], names)
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["MEGASCALE_NUM_SLICES"]["value"] == str(slices)
    assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == "knobs-slice-0-0.knobs"
    assert env["MEGASCALE_SLICE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['jobset.sigs.k8s.io/job-global-index']")
    assert refused(num_slices=2, env={"MEGASCALE_PORT": "9090"}).startswith("env: MEGASCALE_PORT is set by xrun itself")


def test_networks_override_names_the_gpu_nics():
    nets = [f"c-gpunet-{i}-subnet" for i in range(8)]
    t = tmpl(render(accelerator="h100-mega-80gb-8", networks=nets))
    nics = json.loads(t["metadata"]["annotations"]["networking.gke.io/interfaces"])
    assert [n["network"] for n in nics] == ["default", *nets]
    assert refused(accelerator="h100-mega-80gb-8", networks=nets[:7]).startswith(
        "networks: h100-mega-80gb-8 (tcpxo) attaches 8 NICs, so name 8 Network objects (eth1..eth8), got 7")
    assert refused(networks=["a"]).startswith("networks: only for GPU shapes whose networking stack attaches NICs")
    assert refused(accelerator="h100-mega-80gb-8", networks=[*nets[:7], nets[0]]) == (
        f"networks: {nets[0]} is named twice")


def node(name: str, pool: str, labels: dict[str, str], taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"cloud.google.com/gke-nodepool": pool, "kubernetes.io/hostname": name,
                                                  **labels}},
            "spec": {"taints": taints or []}}


V6E_2X4 = {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice", "cloud.google.com/gke-tpu-topology": "2x4",
           "node.kubernetes.io/instance-type": "ct6e-standard-4t"}
TPU_TAINT = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}


def test_capacity_counts_whole_untainted_pools_per_slice():
    """Offline twin of tests/test_cluster_gke_first_run.py (which reads real nodes): one pool
    per slice, a node per VM, taints the pods do not tolerate rule a pool out."""
    from orchestrator.services.cluster import capacity_problem, node_pools

    nodes = [node(f"a-{i}", "a", V6E_2X4, [TPU_TAINT]) for i in range(2)]
    nodes += [node(f"b-{i}", "b", V6E_2X4, [TPU_TAINT]) for i in range(1)]  # one VM short
    nodes += [node(f"s-{i}", "s", {**V6E_2X4, "cloud.google.com/gke-spot": "true"},
                   [TPU_TAINT, {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}])
              for i in range(2)]
    pools = node_pools(nodes)
    assert [p.describe() for p in pools] == ["a (tpu-v6e-slice 2x4 ct6e-standard-4t x2)",
                                             "b (tpu-v6e-slice 2x4 ct6e-standard-4t x1)",
                                             "s (tpu-v6e-slice 2x4 ct6e-standard-4t x2)"]
    one = build_spec({**BASE, "accelerator": "v6e-8"}, {}, storage_default=STORAGE)
    assert capacity_problem(one, pools) == ""
    two = build_spec({**BASE, "accelerator": "v6e-8", "num_slices": 2}, {}, storage_default=STORAGE)
    assert ", 1 fit; TPU node pools seen: a (" in capacity_problem(two, pools)  # b too small, s tainted
    spot = build_spec({**BASE, "accelerator": "v6e-8", "capacity": "spot"}, {}, storage_default=STORAGE)
    assert capacity_problem(spot, pools) == ""
    assert "(also labelled cloud.google.com/gke-spot=true)" in capacity_problem(
        build_spec({**BASE, "accelerator": "v6e-8", "capacity": "spot", "num_slices": 2}, {}, storage_default=STORAGE),
        pools)


def test_network_names_are_picked_as_the_cluster_numbers_them():
    from manifests.catalogue import lookup
    from orchestrator.services.cluster import order_networks, pick_networks

    ultra = ["c-sub-1", *(f"c-rdma-sub-{i}" for i in range(8))]
    assert order_networks(sorted(ultra)) == ultra
    mega = [f"c-gpunet-{i}-subnet" for i in (10, 2, 1, 0, 3, 4, 5, 6)]
    assert order_networks(mega)[:3] == ["c-gpunet-0-subnet", "c-gpunet-1-subnet", "c-gpunet-2-subnet"]
    stack = lookup("h200-141gb-8").networking
    assert pick_networks("h200-141gb-8", stack, [], ultra) == (
        ultra, "networks: eth1..eth9 on the cluster's Networks " + ", ".join(ultra))
    assert pick_networks("h200-141gb-8", stack, [], ["gvnic-1", *(f"rdma-{i}" for i in range(8)), "x"]) == ([], "")
    with pytest.raises(XrunError) as e:
        pick_networks("h200-141gb-8", stack, [], None)
    assert e.value.exit_code == EXIT_USAGE and "serves no networking.gke.io Network objects" in str(e.value)


def test_doctor_lists_each_mounted_bucket_once(gcs_bucket):
    """A GCS FUSE bucket that does not exist fails the pods at mount: doctor says so."""
    from orchestrator.services.doctor import check_mounts

    bucket = gcs_bucket.removeprefix("gs://")
    check = check_mounts([bucket])
    assert (check.name, check.result) == ("mounts", "ok"), check
    check = check_mounts([bucket, "no-such-bucket-xrun"])
    assert (check.result, check.exit_code) == ("FAIL", 1)
    assert check.detail.startswith("mounts: bucket gs://no-such-bucket-xrun does not exist"), check.detail


def test_tpu7x_renders_as_gke_labels_it_and_keeps_off_libtpus_port():
    """TPU7x (Ironwood): accelerator tpu7x on tpu7x-standard-4t, 4 chips a VM; the
    coordinator leaves 8476 to libtpu (a host port under hostNetwork)."""
    obj = render(accelerator="tpu7x-16", num_slices=2)
    pod = tmpl(obj)["spec"]
    assert {k: pod["nodeSelector"][k] for k in ("cloud.google.com/gke-tpu-accelerator",
                                                  "cloud.google.com/gke-tpu-topology",
                                                  "node.kubernetes.io/instance-type")} == {
        "cloud.google.com/gke-tpu-accelerator": "tpu7x", "cloud.google.com/gke-tpu-topology": "2x2x2",
        "node.kubernetes.io/instance-type": "tpu7x-standard-4t"}
    container = pod["containers"][0]
    assert container["resources"]["limits"] == {"google.com/tpu": "4"}
    assert obj["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] == 2
    assert {"name": "coordinator", "containerPort": 8482} in container["ports"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["JAX_COORDINATOR_ADDRESS"].endswith(":8482")
    assert "8476" not in json.dumps(obj)
    assert refused(accelerator="tpu7x-8", coordinator_port=8476).startswith("coordinator_port: 8476 is libtpu's")
    assert "8476" in json.dumps(render(accelerator="v6e-8"))  # other families keep the default
