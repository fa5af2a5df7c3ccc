"""`xrun nightly`: the nightly file's validation, run names, dry run, and the CronJob objects
(`--render-cronjob`) validated strictly against the Kubernetes schemas."""

from __future__ import annotations

import datetime as dt
import re

import pytest
import yaml
from cli_helpers import xrun
from manifest_schemas import validate_k8s

from manifests.nightly import RBAC_RULES
from manifests.spec import DNS1035
from orchestrator.nightly_file import load_nightly, plan_runs
from xrun_contract.errors import XrunError as NightlyError

KUBE = {
    "prefix": "nightly",
    "schedule": "30 2 * * 1-5",
    "time_zone": "Europe/Paris",
    "storage": "gs://team-bucket/xrun",
    "slice": {"accelerator": "v6e-32", "num_slices": 2},
    "base": "main",
    "branches": {
        "main": {"image": "us-docker.pkg.dev/p/r/xrun:main-abc1234", "commit": "abc1234"},
        "feature/Faster_Attention-with-a-very-long-branch-name": {
            "image": "us-docker.pkg.dev/p/r/xrun:fa-def5678", "commit": "def5678"},
    },
    "configs": {"1b": {"command": "python3 -m workload.train --preset 1b steps=300"},
                "tiny": {"command": "python3 -m workload.train --preset tiny steps=100", "env": {"A": "1"}}},
    "backend": "kube",
    "namespace": "team",
    "run": {"max_restarts": 0, "service_account": "xrun-workload"},
    "timeout": "2h",
    "cronjob": {"image": "us-docker.pkg.dev/p/r/xrun-cli:0.1.0",
                "gcp_service_account": "xrun@p.iam.gserviceaccount.com"},
}


def write(tmp_path, data, name="nightly.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_runs_are_planned_base_first_with_unique_valid_names(tmp_path):
    cfg = load_nightly(str(write(tmp_path, KUBE)))
    when = dt.datetime(2025, 1, 3, 3, 0, 5, tzinfo=dt.UTC)
    runs = plan_runs(cfg, when)
    assert [(r.config.name, r.branch.name) for r in runs] == [
        ("1b", "main"), ("1b", "feature/Faster_Attention-with-a-very-long-branch-name"),
        ("tiny", "main"), ("tiny", "feature/Faster_Attention-with-a-very-long-branch-name")]
    names = [r.name for r in runs]
    assert names[0] == "nightly-main-20250103-030005-0" and names[2] == "nightly-main-20250103-030005-2"
    # The branch is cut so that pod names <name>-slice-1-7-xxxxx stay within 63 characters.
    assert names[1] == "nightly-feature-faster-attent-20250103-030005-1" and len(names[1]) == 47
    assert len(set(names)) == 4
    for r in runs:
        assert DNS1035.match(r.name) and len(r.name) <= 63 - len("-slice-1-7-xxxxx")
        assert r.spec.image == cfg.branches[r.index % 2].image and r.spec.commit in ("abc1234", "def5678")
        assert r.spec.branch == r.branch.name and r.spec.max_restarts == 0 and r.spec.backend_name == "kube"
        assert r.spec.accelerator == "v6e-32" and r.spec.num_slices == 2 and r.spec.namespace == "team"
    assert runs[2].spec.env == {"A": "1"} and runs[0].spec.env == {}
    assert cfg.timeout_s == 7200 and cfg.threshold_pct == 5.0


@pytest.mark.parametrize("change, message", [
    ({"base": "develop"}, "base: branch 'develop' is not under branches"),
    ({"branches": {"main": {"image": "x"}}}, "branches: need the base and at least one candidate"),
    ({"branches": {"main": {"image": "x"}, "f": {"commit": "1"}}}, "branches.f.image: required"),
    ({"branches": {"main": {"image": "x"}, "f": {"image": "y", "tag": 1}}}, "branches.f: unknown key 'tag'"),
    ({"configs": {}}, "configs: need at least one config"),
    ({"configs": {"a": {"command": ""}}}, "configs.a.command: required"),
    ({"slice": {"accelerator": "v9z-3"}}, "accelerator: unknown"),
    ({"slice": {}}, "slice.accelerator: required"),
    ({"schedule": "0 25 * * *"}, "schedule: hour value '25' is outside 0-23"),
    ({"schedule": "daily"}, "schedule: 'daily' must have 5 fields"),
    ({"threshold": "five"}, "threshold: 'five' is not a percentage"),
    ({"timeout": "-1"}, "timeout: '-1' is not a duration"),
    ({"prefix": "Nightly!"}, "prefix: 'Nightly!' must be"),
    ({"storage": "s3://bucket"}, "storage: 's3://bucket'"),
    ({"run": {"image": "x"}}, "run: unknown key 'image'"),
    ({"colour": "blue"}, "nightly file: unknown key 'colour'"),
    ({"backend": "slurm"}, "backend: must be local or kube"),
])
def test_bad_nightly_files_name_the_field(tmp_path, change, message):
    data = {**KUBE, **change}
    with pytest.raises(NightlyError) as e:
        load_nightly(str(write(tmp_path, data)))
    assert message in str(e.value) and "\n" not in str(e.value)
    r = xrun("nightly", "-f", str(tmp_path / "nightly.yaml"), storage=tmp_path / "root")
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "root").exists()  # nothing submitted or written


def test_dry_run_prints_the_run_files(tmp_path):
    r = xrun("nightly", "-f", str(write(tmp_path, KUBE)), "--dry-run", storage=tmp_path / "root")
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert len(docs) == 4 and docs[0]["branch"] == "main" and docs[0]["storage"] == "gs://team-bucket/xrun"
    assert all(re.fullmatch(r"nightly-.*-\d{8}-\d{6}-\d", d["name"]) for d in docs)


def test_render_cronjob_objects_validate_and_grant_only_what_xrun_needs(tmp_path):
    path = write(tmp_path, KUBE)
    r = xrun("nightly", "-f", str(path), "--render-cronjob", storage=tmp_path / "root")
    assert r.returncode == 0, r.stderr
    docs = list(yaml.safe_load_all(r.stdout))
    kinds = {d["kind"]: d for d in docs}
    assert list(kinds) == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "CronJob"]
    for d in docs:
        validate_k8s(d)  # kubernetes-validate, strict: unknown fields fail
        assert d["metadata"]["namespace"] == "team"
    cron = kinds["CronJob"]["spec"]
    assert cron["schedule"] == "30 2 * * 1-5" and cron["timeZone"] == "Europe/Paris"
    assert cron["concurrencyPolicy"] == "Forbid"
    job = cron["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0 and job["activeDeadlineSeconds"] == 4 * 7200 + 3600
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == "xrun-nightly" and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["command"] == ["xrun", "nightly", "-f", "/etc/xrun/nightly.yaml"]
    assert container["image"] == "us-docker.pkg.dev/p/r/xrun-cli:0.1.0"
    # The ConfigMap carries the nightly file verbatim and an in-cluster kubeconfig.
    data = kinds["ConfigMap"]["data"]
    assert data["nightly.yaml"] == path.read_text()
    kubeconfig = yaml.safe_load(data["kubeconfig"])
    assert kubeconfig["users"][0]["user"] == {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}
    assert kubeconfig["contexts"][0]["context"]["namespace"] == "team"
    assert {"name": "KUBECONFIG", "value": "/etc/xrun/kubeconfig"} in container["env"]
    # RBAC: exactly the verbs the cluster backend uses, nothing cluster-wide.
    rules = kinds["Role"]["rules"]
    assert rules == [
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"],
         "verbs": ["create", "get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods", "pods/log", "events"], "verbs": ["get", "list", "watch"]},
    ] == RBAC_RULES
    binding = kinds["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "xrun-nightly"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "xrun-nightly", "namespace": "team"}]
    sa = kinds["ServiceAccount"]["metadata"]
    assert sa["annotations"] == {"iam.gke.io/gcp-service-account": "xrun@p.iam.gserviceaccount.com"}
    # A strict validator that accepts everything would prove nothing: it must reject a typo.
    broken = dict(kinds["CronJob"], spec={**cron, "concurrencyPolcy": "Forbid"})
    with pytest.raises(Exception, match="concurrencyPolcy"):
        validate_k8s(broken)


def test_render_cronjob_needs_a_cluster_backend_and_an_image(tmp_path):
    local = {**KUBE, "backend": "local", "storage": str(tmp_path / "s")}
    r = xrun("nightly", "-f", str(write(tmp_path, local)), "--render-cronjob", storage=tmp_path / "root")
    assert r.returncode == 2 and "backend: --render-cronjob needs 'backend: kube'" in r.stderr
    no_image = {**KUBE, "cronjob": {}}
    r = xrun("nightly", "-f", str(write(tmp_path, no_image)), "--render-cronjob", storage=tmp_path / "root")
    assert r.returncode == 2 and "cronjob.image" in r.stderr and r.stdout == ""


def test_help_of_the_comparison_commands_has_examples(tmp_path):
    for cmd in ("compare", "report", "nightly"):
        r = xrun(cmd, "--help", storage=tmp_path)
        assert r.returncode == 0 and "Examples:" in r.stdout and "Exit code" in r.stdout, cmd
