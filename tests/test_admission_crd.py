"""Offline admission's CRD-level rules come from the upstream JobSet CRD: the committed
manifests/admission/crd_rules.py is what gen_crd_rules makes from it, and each kind of rule
taken from it refuses a rendered JobSet that breaks it, naming the field."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from manifests.admission import apiserver, check, crd_rules, gen_crd_rules, violations
from manifests.admission.base import AdmissionError
from manifests.jobset import jobset
from manifests.spec import build_spec

REPO = Path(__file__).resolve().parents[1]
# CI keeps the upstream CRD beside the checkout (.ci/run checks it is there); a worktree
# elsewhere names it with XRUN_JOBSET_CRD.
CRD = Path(os.environ.get("XRUN_JOBSET_CRD") or REPO.parent / "shared" / "schemas" / "jobset.x-k8s.io_jobsets.yaml")


@pytest.fixture(scope="module")
def crd() -> dict:
    if not CRD.is_file():
        pytest.skip(f"the upstream JobSet CRD is not at {CRD} (../shared/schemas beside the checkout, as in CI)")
    # libyaml where PyYAML has it: the CRD is 0.6 MB of YAML (a second of pure-Python scanning)
    return yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506 - safe


def test_the_committed_rules_are_what_the_generator_makes_from_the_crd(crd):
    assert (REPO / "manifests" / "admission" / "crd_rules.py").read_text() == gen_crd_rules.render(crd)


def test_the_generator_reads_a_changed_crd(crd):
    changed = copy.deepcopy(crd)
    (version,) = [v for v in changed["spec"]["versions"] if v["name"] == "v1alpha2"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["properties"]["ttlSecondsAfterFinished"]["maximum"] = 3600
    spec["properties"]["replicatedJobs"]["items"]["properties"]["template"]["properties"]["spec"]["minimum"] = 9
    rules = gen_crd_rules.rules(changed)
    assert rules["MAXIMUMS"] == {"spec.ttlSecondsAfterFinished": 3600}
    assert not any("template" in path for table in rules.values() for path in table)  # core types left out


def test_every_create_time_cel_rule_has_a_python_check():
    rules = {rule for checks in crd_rules.CEL.values() for rule, _ in checks}
    assert rules and rules <= set(apiserver.CEL_CHECKS), rules - set(apiserver.CEL_CHECKS)


def test_the_int32_fields_the_mutating_webhook_decodes_are_the_crds():
    jobset_paths = {p for p in apiserver._INT32_FIELDS if not p.startswith("spec.replicatedJobs.template")}
    assert jobset_paths == {p.replace("[]", "") for p in crd_rules.INT32}


def _rendered() -> dict:
    spec = build_spec({"name": "crd", "accelerator": "v6e-16", "num_slices": 2, "image": "example.com/x:1"}, {},
                      storage_default="/tmp/xrun-test-storage")
    obj = jobset(spec)
    assert violations(obj) == []
    return obj


def _refused(obj: dict, path: str, rule: str) -> str:
    found = [v for v in violations(obj) if v.path == path]
    assert [v.rule for v in found] == [rule], [v.line() for v in violations(obj)]
    with pytest.raises(AdmissionError) as err:
        check(obj)
    assert str(err.value).startswith(f"{path}: "), str(err.value)
    return found[0].line()


def test_a_negative_replicas_is_refused_by_the_crds_minimum():
    obj = _rendered()
    obj["spec"]["replicatedJobs"][0]["replicas"] = -1
    line = _refused(obj, "spec.replicatedJobs[0].replicas", "crd-minimum")
    assert line == "spec.replicatedJobs[0].replicas: -1 must be >= 0 (jobset.x-k8s.io_jobsets.yaml:minimum)"


def test_more_depends_on_than_the_crd_allows_is_refused():
    obj = _rendered()
    rjs = obj["spec"]["replicatedJobs"]
    for i in range(6):
        rjs.append({**copy.deepcopy(rjs[0]), "name": f"r{i}"})
    rjs.append({**copy.deepcopy(rjs[0]), "name": "last",
                "dependsOn": [{"name": rj["name"], "status": "Ready"} for rj in rjs[:6]]})
    line = _refused(obj, "spec.replicatedJobs[7].dependsOn", "crd-max-items")
    assert "7 items" not in line and "6 items; at most 5" in line, line


def test_a_volume_claim_policy_template_naming_a_namespace_is_refused_by_the_crds_cel_rule():
    obj = _rendered()
    obj["spec"]["volumeClaimPolicies"] = [{"templates": [{"metadata": {"name": "d", "namespace": "other"}}]}]
    line = _refused(obj, "spec.volumeClaimPolicies[0]", "crd-cel")
    assert "namespace cannot be set for VolumeClaimPolicies templates" in line


def test_admission_enforces_what_the_rules_module_says(monkeypatch):
    obj = _rendered()
    assert obj["spec"]["successPolicy"]["operator"] == "All"
    monkeypatch.setitem(crd_rules.ENUMS, "spec.successPolicy.operator", ("Any",))
    (v,) = violations(obj)
    assert (v.path, v.rule, v.detail) == ("spec.successPolicy.operator", "success-policy-operator",
                                          'supported values: "Any"')
