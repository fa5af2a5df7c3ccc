"""The scripted API server admits JobSets as a cluster does (defaulting webhook, apiserver
checks, JobSet's validating webhook), answered in the real server's forms; driven through
the real ``kubernetes`` client and ``KubeBackend``, never patched."""

from __future__ import annotations

import json

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from manifests import admission
from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend
from xrun_contract.errors import XrunError as BackendError

RULE_TEXT = ("invalid failure policy rule name 'fail-on-user-error', a failure policy rule name must start with "
             "an alphabetic character, optionally followed by a string of alphanumeric characters or '_,:', and "
             "must end with an alphanumeric character or '_'")


def manifest(name: str, **extra) -> dict:
    flags = {"name": name, "accelerator": "v6e-8", "num_slices": 2, "image": "img:1",
             "storage": "gs://xrun-bucket/runs", "backend": "kube", **extra}
    return jobset(build_spec({}, flags))


def bad_rule(name: str) -> dict:
    obj = manifest(name)
    obj["spec"]["failurePolicy"]["rules"][0]["name"] = "fail-on-user-error"
    return obj


def raw_create(kubeconfig: str, body: dict) -> ApiException:
    """POST the JobSet with the plain client; the refusal as the client raises it."""
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig))
    with pytest.raises(ApiException) as info:
        api.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", "default", "jobsets", body)
    return info.value


def submit_error(kubeconfig: str, body: dict) -> BackendError:
    backend = KubeBackend(None, "default", kubeconfig, poll_seconds=0.05, watch_timeout_seconds=1)
    with pytest.raises(BackendError) as info:
        backend.submit(body)
    return info.value


def test_a_bad_failure_rule_name_is_refused_by_the_jobset_webhook(api, kubeconfig):
    e = raw_create(kubeconfig, bad_rule("bad-rule"))
    assert e.status == 422
    body = json.loads(e.body)
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["reason"] == "Invalid"
    assert body["code"] == 422
    assert body["message"] == ('admission webhook "vjobset.kb.io" denied the request: JobSet.jobset.x-k8s.io '
                               f'"bad-rule" is invalid: <nil>: Internal error: {RULE_TEXT}')
    assert body["details"] == {"name": "bad-rule", "group": "jobset.x-k8s.io", "kind": "JobSet", "causes": [
        {"reason": "InternalError", "message": f"Internal error: {RULE_TEXT}", "field": "<nil>"}]}

    err = submit_error(kubeconfig, bad_rule("bad-rule"))
    assert err.exit_code == 1 and "\n" not in str(err)
    assert str(err).startswith("jobsets.jobset.x-k8s.io 'bad-rule' rejected by the cluster (422 Invalid): "
                               'admission webhook "vjobset.kb.io" denied the request:')
    assert "failure policy rule name 'fail-on-user-error'" in str(err)
    assert api.jobsets == {}  # nothing was stored

    # Before JobSet v0.12 the webhook denied with 403 Forbidden and the joined error texts.
    api.jobset_webhook_version = (0, 11)
    e = raw_create(kubeconfig, bad_rule("old-rule"))
    body = json.loads(e.body)
    assert (e.status, body["reason"], body["code"]) == (403, "Forbidden", 403)
    assert body["message"] == f'admission webhook "vjobset.kb.io" denied the request: {RULE_TEXT}'
    err = submit_error(kubeconfig, bad_rule("old-rule"))
    assert "rejected by an admission webhook" in str(err) and "'fail-on-user-error'" in str(err)


def test_apiserver_and_job_rules_come_back_as_invalid_with_the_field(api, kubeconfig):
    schema = manifest("bad-op")
    schema["spec"]["successPolicy"]["operator"] = "Some"
    e = raw_create(kubeconfig, schema)
    body = json.loads(e.body)
    assert (e.status, body["reason"]) == (422, "Invalid")
    assert body["message"] == ('JobSet.jobset.x-k8s.io "bad-op" is invalid: spec.successPolicy.operator: '
                               'Unsupported value: "Some": supported values: "All", "Any"')
    assert body["details"]["causes"] == [{"reason": "FieldValueNotSupported", "field": "spec.successPolicy.operator",
                                          "message": 'Unsupported value: "Some": supported values: "All", "Any"'}]

    env = manifest("bad-env")
    pod = env["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["env"].append({"name": "A=B", "value": "x"})
    pod["containers"][0]["ports"][0]["hostPort"] = 9999
    e = raw_create(kubeconfig, env)
    body = json.loads(e.body)
    fields = [c["field"] for c in body["details"]["causes"]]
    c0 = "spec.replicatedJobs[0].template.spec.template.spec.containers[0]"
    assert fields == [f"{c0}.env[{len(pod['containers'][0]['env']) - 1}].name", f"{c0}.ports[0].hostPort"]
    assert body["message"].startswith('JobSet.jobset.x-k8s.io "bad-env" is invalid: [' + fields[0] + ': Invalid value: '
                                      '"A=B": a valid environment variable name must consist only of')
    err = submit_error(kubeconfig, env)
    assert "\n" not in str(err) and f"{fields[0]}: Invalid value" in str(err)
    assert api.jobsets == {}


def test_what_the_mutating_webhook_cannot_decode_comes_back_as_its_400(api, kubeconfig):
    """JobSet's mutating webhook decodes the JobSet first: an int32 overflow is its decode
    error alone, 400 BadRequest with no field, as the real server answers."""
    body = manifest("huge")
    body["spec"]["replicatedJobs"][0]["replicas"] = 2**31
    e = raw_create(kubeconfig, body)
    status = json.loads(e.body)
    assert (e.status, status["reason"]) == (400, "BadRequest")
    assert status["message"] == (
        'admission webhook "mjobset.kb.io" denied the request: json: cannot unmarshal number 2147483648 into Go '
        "struct field ReplicatedJob.spec.replicatedJobs.replicas of type int32")
    assert api.jobsets == {}


def test_an_admitted_jobset_is_stored_defaulted(api, kubeconfig):
    body = manifest("good")
    KubeBackend(None, "default", kubeconfig, poll_seconds=0.05, watch_timeout_seconds=1).submit(body)
    (create,) = api.requests_to("POST", "/jobsets$")
    assert create.body == body  # sent as rendered
    stored = api.jobsets[("default", "good")]
    expected = admission.default(body)
    assert {k: v for k, v in stored.items() if k not in ("metadata", "status")} == \
        {k: v for k, v in expected.items() if k != "metadata"}
    assert stored["spec"]["network"]["publishNotReadyAddresses"] is True
    assert stored["spec"]["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert stored["spec"]["failurePolicy"]["restartStrategy"] == "Recreate"
    got = client.CustomObjectsApi(config.new_client_from_config(config_file=kubeconfig)).get_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", "default", "jobsets", "good")
    assert got["spec"] == expected["spec"]


def test_a_template_the_job_api_refuses_stalls_the_jobset_as_on_a_cluster(api, kubeconfig):
    """With job_template_errors="event" the server plays the real sequence: the JobSet is
    stored, the controller's Job creates fail (JobCreationFailed), no pod ever appears."""
    api.job_template_errors = "event"
    api.script([lambda s, n: s.set_pods(n, 0, "Running")])  # would start pods if Jobs existed
    body = manifest("ev-env")
    body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "A=B", "value": "x"})
    backend = KubeBackend(None, "default", kubeconfig, poll_seconds=0.05, watch_timeout_seconds=1)
    backend.submit(body)
    assert ("default", "ev-env") in api.jobsets and api.pods_of("ev-env") == []
    (event,) = api.events
    index = len(body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]) - 1
    assert event["reason"] == "JobCreationFailed" and event["involvedObject"]["kind"] == "JobSet"
    assert event["message"].splitlines()[1] == (
        'job "ev-env-slice-1" creation failed with error: Job.batch "ev-env-slice-1" is invalid: '
        f'spec.template.spec.containers[0].env[{index}].name: Invalid value: "A=B": a valid environment variable '
        "name must consist only of printable ASCII characters other than '='")
    st = backend.status("ev-env")
    assert st.state == "Pending" and st.hosts == []
    assert st.events[0].startswith('JobCreationFailed (jobset/ev-env): job "ev-env-slice-0" creation failed')
