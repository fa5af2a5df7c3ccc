"""The scripted API server as a cluster (tests/kube_api.py ``JobSetController``), and xrun
right against it: a controller on its own clock, grace periods, TTL, expired watches,
bookmarks, kubelets that go away, events that expire, RBAC, the context's namespace,
GKE's TPU webhook and Kueue. Assertions are on what crossed the wire and what xrun did.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from cli_helpers import xrun, xrun_popen
from kube_api import JobSetController, KubeAPI, Program, gke_tpu_env

from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend
from orchestrator.backends.kube.state import restarts_from_events
from xrun_contract import Layout
from xrun_contract.errors import XrunError
from xrun_contract.storage import open_storage

ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"


def backend_for(kubeconfig: str, namespace: str | None = "default") -> KubeBackend:
    return KubeBackend(None, namespace, kubeconfig, poll_seconds=0.05, watch_timeout_seconds=1)


def manifest(name: str, **extra: Any) -> dict:
    flags = {"name": name, "accelerator": "v6e-8", "num_slices": 1, "image": "img:1",
             "storage": "gs://xrun-bucket/runs", "backend": "kube", "namespace": "default", **extra}
    return jobset(build_spec({}, flags))


def get(api: KubeAPI, path: str) -> tuple[int, list[dict] | dict | str]:
    """One request as any client makes it; a stream is read to its end (JSON lines)."""
    req = urllib.request.Request(api.url + path, headers={"Authorization": f"Bearer {api.token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body, code = r.read().decode(), r.status
    except urllib.error.HTTPError as e:
        body, code = e.read().decode(), e.code
    if "watch=true" in path and code == 200:
        return code, [json.loads(x) for x in body.splitlines() if x.strip()]
    try:
        return code, json.loads(body)
    except ValueError:
        return code, body


def attempt_of(pod: dict) -> int:
    return int(pod["metadata"]["labels"][ATTEMPT])


# --- the fake behaves like a cluster ------------------------------------------------------


def test_controller_runs_on_its_own_clock_and_restarts_after_the_grace_period(api, kubeconfig):
    """Nobody reads the JobSet, yet it runs, loses a pod to SIGKILL (137: restartable),
    restarts once the old pods are gone, and completes; then its TTL deletes it."""
    backend_for(kubeconfig).submit(manifest("clock"))
    program = Program(lines=4, line_every=0.01, fail={("0-1", 0): (2, 137)}, sigterm_seconds=1.0)
    JobSetController(api, program, ttl_after_finished=0.1).start()
    api.wait_for(lambda: ("default", "clock") not in api.jobsets, timeout=20)
    assert [r.path for r in api.requests if "/jobsets/clock" in r.path] == []  # no reads drove it
    js = next(o for rv, k, _, t, o in reversed(api.history) if k == "jobsets" and t == "DELETED")
    assert js["status"]["restarts"] == 1
    assert {c["type"]: c["reason"] for c in js["status"]["conditions"]} == {
        "Completed": "AllJobsCompleted", "RestartingJobSet": "JobSetCompleted"}
    pods = [(rv, t, o) for rv, k, _, t, o in api.history if k == "pods"]
    # 0-0 got SIGTERM and ignored it for the whole grace period (120 s x time_scale): SIGKILL.
    marked = next(rv for rv, t, o in pods if attempt_of(o) == 0 and o["metadata"].get("deletionTimestamp"))
    killed = next(o for rv, t, o in pods if attempt_of(o) == 0 and o["metadata"].get("deletionTimestamp")
                  and o["status"]["phase"] == "Failed" and o["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "0")
    assert killed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 137
    last_old_gone = max(rv for rv, t, o in pods if attempt_of(o) == 0 and t == "DELETED")
    first_new = min(rv for rv, t, o in pods if attempt_of(o) == 1)
    assert marked < last_old_gone < first_new  # new Jobs only once the old pods are gone
    reasons = [e["reason"] for e in api.events if e["involvedObject"]["name"] == "clock"]
    # jobset v0.12 failure_policy.go: the RestartingJobSet condition (no rule matched a
    # SIGKILL: DefaultFailurePolicy) and the action's event; False once all Jobs are ready,
    # then again (JobSetCompleted) as the set completes.
    assert reasons == ["DefaultFailurePolicy", "RestartJobSetFailurePolicyAction", "JobsReady",
                       "AllJobsCompleted", "JobSetCompleted"]
    lines = {text for pod in api.logs.values() for _, text in pod}
    assert {"host 0-1 attempt 0 line 1", "host 0-1 attempt 1 line 3"} <= lines
    assert "host 0-1 attempt 0 line 2" not in lines  # killed before it


def test_failure_policy_a_user_error_fails_the_jobset_without_restart(api, kubeconfig):
    backend_for(kubeconfig).submit(manifest("bug"))
    JobSetController(api, Program(lines=3, line_every=0.01, fail={("0-0", 0): (1, 1)})).start()
    api.wait_for(lambda: any(c["type"] == "Failed" for c in api.jobsets[("default", "bug")]["status"].get("conditions", [])))
    st = api.jobsets[("default", "bug")]["status"]
    assert st["restarts"] == 0
    assert [c["reason"] for c in st["conditions"]] == ["FailJobSetFailurePolicyAction"]
    assert "first failed job: bug-slice-0" in st["conditions"][0]["message"]


def test_failures_of_one_job_within_a_sync_are_judged_together(api, kubeconfig):
    """A host's restartable exit (42) and its peer's non-restartable one (1) 20 ms later fall
    in one Job controller sync (syncJobBatchPeriod 1 s x time_scale 0.05 = 50 ms): FailJob
    wins and nothing restarts. The same pair 290 ms apart: the first Job sync has already
    failed the Job restartably, and the JobSet restarts and completes."""
    def failed_or_completed(name: str) -> dict:
        def done() -> bool:
            conds = api.jobsets[("default", name)]["status"].get("conditions", [])
            return any(c["type"] in ("Failed", "Completed") and c["status"] == "True"
                       for c in conds)
        api.wait_for(done, timeout=20)
        return api.jobsets[("default", name)]["status"]

    program = Program(lines=40, line_every=0.01, fail={("0-0", 0): (1, 42), ("0-1", 0): (3, 1)})
    JobSetController(api, program, time_scale=0.05).start()
    backend_for(kubeconfig).submit(manifest("tie"))
    st = failed_or_completed("tie")
    assert st["restarts"] == 0
    assert [c["reason"] for c in st["conditions"]] == ["FailJobSetFailurePolicyAction"]
    program.fail[("0-1", 0)] = (30, 1)
    backend_for(kubeconfig).submit(manifest("apart"))
    st = failed_or_completed("apart")
    assert st["restarts"] == 1
    assert "AllJobsCompleted" in [c["reason"] for c in st["conditions"]]


def test_watch_lists_first_expires_with_410_and_sends_bookmarks(api, kubeconfig):
    backend_for(kubeconfig).submit(manifest("w"))
    JobSetController(api, Program(lines=50, line_every=0.05)).start()
    api.wait_for(lambda: len(api.pods_of("w")) == 2)
    base = "/api/v1/namespaces/default/pods?watch=true&labelSelector=jobset.sigs.k8s.io%2Fjobset-name%3Dw"
    # No resourceVersion: a synthetic ADDED per existing pod first.
    code, events = get(api, base + "&timeoutSeconds=1")
    assert code == 200 and [e["type"] for e in events[:2]] == ["ADDED", "ADDED"]
    assert {e["object"]["metadata"]["name"] for e in events[:2]} == {p["metadata"]["name"] for p in api.pods_of("w")}
    # Bookmarks carry only a resourceVersion.
    rv = api.rv
    code, events = get(api, base + f"&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=1")
    marks = [e for e in events if e["type"] == "BOOKMARK"]
    assert marks and set(marks[0]["object"]["metadata"]) == {"resourceVersion"}
    # A compacted resourceVersion: a 200 stream with one ERROR event (the watch cache) ...
    api.compact()
    code, events = get(api, base + f"&resourceVersion={rv}&timeoutSeconds=1")
    assert code == 200 and events == [{"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410, "reason": "Expired",
        "message": f"too old resource version: {rv} ({events[0]['object']['message'].split('(')[1][:-1]})"}}]
    # ... or an HTTP 410.
    api.expired_as_status = True
    code, body = get(api, base + f"&resourceVersion={rv}&timeoutSeconds=1")
    assert code == 410 and body["reason"] == "Expired"


def test_pod_logs_400_before_a_node_and_500_while_its_kubelet_is_down(api, kubeconfig):
    backend_for(kubeconfig).submit(manifest("lg"))
    ctl = JobSetController(api, Program(lines=100, line_every=0.02), schedule_after=0.3).start()
    api.wait_for(lambda: len(api.pods_of("lg")) == 2)
    name = sorted(p["metadata"]["name"] for p in api.pods_of("lg"))[0]
    code, body = get(api, f"/api/v1/namespaces/default/pods/{name}/log")
    assert code == 400 and body["message"] == f"pod {name} does not have a host assigned"
    api.wait_for(lambda: "host 0-0 attempt 0 line 1" in {t for _, t in api.logs.get(name, [])})
    node = api.pods[("default", name)]["spec"]["nodeName"]
    api.kubelets_down.add(node)
    code, body = get(api, f"/api/v1/namespaces/default/pods/{name}/log")
    assert code == 500 and body["reason"] == "InternalError" and f"dial tcp {node}:10250" in body["message"]
    api.kubelets_down.clear()
    code, body = get(api, f"/api/v1/namespaces/default/pods/{name}/log")
    assert code == 200 and "host 0-0 attempt 0 line 0" in body
    ctl.stop()


def test_events_expire_and_are_selected_by_involved_object(api, kubeconfig):
    api.add_event("JobSet", "a", "RestartJobSetFailurePolicyAction", "applying RestartJobSet failure policy action "
                  "(first failed job: a-slice-0)", uid="uid-a")
    api.add_event("Job", "a-slice-0", "FailedCreate", "Error creating: quota")
    api.add_event("Pod", "other", "FailedScheduling", "not ours")
    code, body = get(api, "/api/v1/namespaces/default/events?fieldSelector=involvedObject.uid%3Duid-a")
    assert [e["reason"] for e in body["items"]] == ["RestartJobSetFailurePolicyAction"]
    code, body = get(api, "/api/v1/namespaces/default/events?fieldSelector=involvedObject.kind%3DJob")
    assert [e["involvedObject"]["name"] for e in body["items"]] == ["a-slice-0"]
    code, body = get(api, "/api/v1/namespaces/default/events?fieldSelector=involvedObject.color%3Dred")
    assert code == 400 and body["message"] == "field label not supported: involvedObject.color"
    api.event_ttl = 0.2
    time.sleep(0.3)
    code, body = get(api, "/api/v1/namespaces/default/events")
    assert body["items"] == []


def test_rbac_forbids_cluster_scoped_reads(api, kubeconfig):
    api.forbidden = {"nodes", "customresourcedefinitions"}
    backend = backend_for(kubeconfig)
    with pytest.raises(XrunError) as e:
        backend.nodes("cloud.google.com/gke-tpu-accelerator")
    assert e.value.exit_code == 1
    assert 'nodes is forbidden: User "tester" cannot list resource "nodes" in API group "" at the cluster scope' in str(e.value)
    with pytest.raises(XrunError) as e:
        backend.jobset_crd()
    assert "forbidden" in str(e.value) and "customresourcedefinitions" in str(e.value)


def test_gke_tpu_webhook_injects_only_under_its_preconditions(api, kubeconfig):
    """Indexed Job, parallelism > 1, a subdomain and a google.com/tpu request: all four."""
    def pod_of(js: dict, p: int = 1) -> tuple[dict, dict]:
        job = js["spec"]["replicatedJobs"][0]["template"]["spec"]
        spec = json.loads(json.dumps(job["template"]["spec"]))
        spec["subdomain"] = js["spec"]["network"]["subdomain"]
        return {"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": str(p)}}, "spec": spec}, job

    def env(pod: dict) -> dict:
        return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}

    multi = manifest("tpu", accelerator="v6e-16", num_slices=1)  # 4 hosts x 4 chips
    pod, job = pod_of(multi)
    assert gke_tpu_env(pod, job, "tpu-slice-0")
    assert env(pod)["TPU_WORKER_ID"] == "1"
    assert env(pod)["TPU_WORKER_HOSTNAMES"] == ",".join(f"tpu-slice-0-{i}.tpu" for i in range(4))
    single = manifest("one", accelerator="v6e-8-single-host", num_slices=1)  # 1 host: parallelism 1
    pod, job = pod_of(single, 0)
    assert not gke_tpu_env(pod, job, "one-slice-0") and "TPU_WORKER_ID" not in env(pod)
    pod, job = pod_of(multi)
    del pod["spec"]["subdomain"]
    assert not gke_tpu_env(pod, job, "tpu-slice-0")
    pod, job = pod_of(multi)
    pod["spec"]["containers"][0]["resources"] = {}
    assert not gke_tpu_env(pod, job, "tpu-slice-0")
    # And on pods the controller makes from what xrun renders.
    backend_for(kubeconfig).submit(multi)
    JobSetController(api, Program(lines=100)).start()
    api.wait_for(lambda: len(api.pods_of("tpu")) == 4)
    ids = sorted(env(p)["TPU_WORKER_ID"] for p in api.pods_of("tpu"))
    assert ids == ["0", "1", "2", "3"]


def test_kueue_keeps_a_queued_jobset_suspended_until_admitted(api, kubeconfig):
    api.kueue_versions = ["v1beta1"]
    backend = backend_for(kubeconfig)
    backend.submit(manifest("q", queue="lq"))
    JobSetController(api, Program(lines=100)).start()
    time.sleep(0.3)
    assert api.pods_of("q") == []
    st = backend.status("q")
    assert (st.state, st.message) == ("Pending", "suspended: waiting for Kueue admission in queue lq")
    api.kueue_admit("q")
    api.wait_for(lambda: len(api.pods_of("q")) == 2)
    conds = api.jobsets[("default", "q")]["status"]["conditions"]
    assert [(c["type"], c["status"], c["reason"]) for c in conds] == [("Suspended", "False", "ResumeJobs")]


# --- xrun right against it ---------------------------------------------------------------


def test_namespace_comes_from_the_kubeconfig_context(api, tmp_path, gcs_bucket):
    cfg = str(api.kubeconfig(tmp_path / "kc", namespace="team"))
    backend = backend_for(cfg, namespace=None)
    assert backend.namespace == "team"
    root = f"{gcs_bucket}/xrun"
    flags = ["--name", "ns", "--tpu", "v6e-8", "--image", "img:1", "--xrun-image", "registry.test/xrun:1",
             "--context", "test-ctx"]
    rendered = xrun("render", *flags, "-o", "json", storage=root, KUBECONFIG=cfg)
    assert "namespace" not in json.loads(rendered.stdout)["metadata"]  # kubectl apply: the context's
    r = xrun("submit", *flags, "--detach", storage=root, KUBECONFIG=cfg)
    assert r.returncode == 0, r.stderr
    (post,) = api.requests_to("POST", "/jobsets$")
    assert post.path == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team/jobsets"
    assert open_storage(root).read_json(Layout.run_json("ns"))["namespace"] == "team"
    r = xrun("status", "ns", "-o", "json", storage=root, KUBECONFIG=cfg)
    assert r.returncode == 0 and api.requests_to("GET", "/namespaces/team/jobsets/ns$")


def test_status_lists_events_by_field_selector_and_keeps_job_failed_create(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("fc", num_slices=2))
    api.add_event("Pod", "someone-else", "FailedScheduling", "not ours")
    JobSetController(api, create_error='pods "fc-slice-0-0" is forbidden: exceeded quota: tpu').start()
    api.wait_for(lambda: len([e for e in api.events if e["reason"] == "FailedCreate"]) == 2)
    st = backend.status("fc")
    assert st.state == "Pending"
    assert st.events == ['FailedCreate (job/fc-slice-1): Error creating: pods "fc-slice-0-0" is forbidden: exceeded quota: tpu']
    asked = [r.query for r in api.requests_to("GET", "/events$")]
    assert asked and all(q.get("fieldSelector", "").startswith("involvedObject.") for q in asked)
    backend.status("fc")  # within EVENTS_SECONDS: no new event lists
    assert len(api.requests_to("GET", "/events$")) == len(asked)


def test_logs_follow_across_kubelet_500_and_expired_watches(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("fl"))
    program = Program(lines=10_000, line_every=0.02, sigterm_seconds=0.02)
    out: list[tuple[str, int, str]] = []
    reader = threading.Thread(target=lambda: out.extend(backend.stream_logs("fl", follow=True)))
    reader.start()
    api.wait_for(lambda: api.requests_to("GET", "^/api/v1/namespaces/default/pods$"))
    JobSetController(api, program).start()
    api.wait_for(lambda: any(t == "host 0-1 attempt 0 line 3" for lines in api.logs.values() for _, t in lines))
    pod = next(p for p in api.pods_of("fl") if p["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"] == "1")
    name = pod["metadata"]["name"]
    api.kubelets_down.add(pod["spec"]["nodeName"])  # the open stream drops, reopening gets 500
    api.wait_for(lambda: sum(1 for p, code in api.log_refused if p == name) >= 2)
    api.kubelets_down.clear()
    n = len(api.logs[name])
    api.wait_for(lambda: len(api.logs[name]) > n and any(
        p == name and line == api.logs[name][n][1] for p, _, line in api.log_sent))  # caught up
    lists = len([r for r in api.requests_to("GET", "^/api/v1/namespaces/default/pods$") if r.query.get("watch") != "true"])
    api.compact()
    api.expire_next_watches = 1  # the pod watch's next (re)connection: 410 Expired, list again
    api.wait_for(lambda: api.expired_sent == 1)
    api.wait_for(lambda: len([r for r in api.requests_to("GET", "^/api/v1/namespaces/default/pods$")
                              if r.query.get("watch") != "true"]) > lists)
    # Only now 0-0 dies (137) and the JobSet restarts: lines of a pod deleted while its node
    # is unreachable exist only in storage (the wrapper's chunks), never in a pod log.
    program.lines = 20
    program.fail[("0-0", 0)] = (0, 137)
    api.wait_for(lambda: any(c["type"] == "Completed" for c in api.jobsets[("default", "fl")]["status"].get("conditions", [])),
                 timeout=60)
    reader.join(60)
    assert not reader.is_alive()
    served = sorted((t for lines in api.logs.values() for _, t in lines))
    got = [text for _, _, text in out]
    assert sorted(got) == served and len(got) == len(set(got)), sorted(set(served) - set(got))  # every line once
    assert {(h, a) for h, a, _ in out} == {("0-0", 0), ("0-1", 0), ("0-0", 1), ("0-1", 1)}
    assert api.jobsets[("default", "fl")]["status"]["restarts"] == 1


def test_kill_and_restart_logs_once_and_status_outlives_the_jobset(api, kubeconfig, gcs_bucket):
    """The Proof: one pod SIGKILLed mid-run, the JobSet restarts after the grace period,
    ``xrun logs -f`` shows every line once, ``xrun status`` says Succeeded before and after
    the JobSet's TTL deleted it."""
    root = f"{gcs_bucket}/xrun"
    flags = ["--name", "kr", "--tpu", "v6e-8", "--image", "img:1", "--xrun-image", "registry.test/xrun:1",
             "--context", "test-ctx"]  # 2 hosts
    r = xrun("submit", *flags, "--detach", storage=root, KUBECONFIG=kubeconfig)
    assert r.returncode == 0, r.stderr
    logs = xrun_popen("logs", "kr", "-f", storage=root, KUBECONFIG=kubeconfig)
    api.wait_for(lambda: [r for r in api.requests_to("GET", "/pods$") if r.query.get("watch") == "true"], timeout=60)
    program = Program(lines=10, line_every=0.05, fail={("0-1", 0): (4, 137)}, sigterm_seconds=0.05)
    ctl = JobSetController(api, program, ttl_after_finished=3600.0).start()
    stdout, stderr = logs.communicate(timeout=90)
    assert logs.returncode == 0, stderr
    printed = stdout.splitlines()
    served = [f"[{t.split()[1]}{'' if t.split()[3] == '0' else ' #' + t.split()[3]}] {t}"
              for lines in api.logs.values() for _, t in lines]
    assert sorted(printed) == sorted(served) and len(printed) == len(set(printed))
    assert "[0-1] host 0-1 attempt 0 line 3" in printed and "[0-1 #1] host 0-1 attempt 1 line 9" in printed
    assert "[0-1] host 0-1 attempt 0 line 4" not in printed
    js = api.jobsets.get(("default", "kr"))
    assert js and js["status"]["restarts"] == 1
    r = xrun("status", "kr", "-o", "json", storage=root, KUBECONFIG=kubeconfig)
    before = json.loads(r.stdout)
    assert (before["state"], before["restarts"]) == ("Succeeded", 1), (r.stderr, js and js["status"])
    assert ("default", "kr") in api.jobsets  # read live: storage learnt the end before the TTL
    ctl.ttl_after_finished = 0.1  # the TTL runs out (on the controller's clock)
    api.wait_for(lambda: ("default", "kr") not in api.jobsets, timeout=30)
    r = xrun("status", "kr", "-o", "json", storage=root, KUBECONFIG=kubeconfig)
    after = json.loads(r.stdout)
    assert r.returncode == 0 and (after["state"], after["restarts"]) == ("Succeeded", 1)
    state = open_storage(root).read_json(Layout.state("kr"))
    assert state["state"] == "Succeeded" and state["transitions"][-1]["state"] == "Succeeded"


def test_status_of_a_run_whose_jobset_the_ttl_deleted_comes_from_its_events(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("gone"))
    JobSetController(api, Program(lines=2, line_every=0.01, fail={("0-0", 0): (1, 42)}), ttl_after_finished=0.05).start()
    api.wait_for(lambda: any(e["reason"] == "AllJobsCompleted" for e in api.events))
    api.wait_for(lambda: ("default", "gone") not in api.jobsets)
    for b in (backend, backend_for(kubeconfig)):  # one that saw it, one that never did
        st = b.status("gone")
        assert (st.state, st.restarts, st.message) == ("Succeeded", 1, "jobset completed successfully")
    api.event_ttl = 0.0  # an hour later: nothing left to say
    assert backend_for(kubeconfig).status("gone") is None


def test_restarts_of_a_gone_jobset_are_read_from_the_events_jobset_really_records(api, kubeconfig):
    """JobSet v0.12 never records "Restarting" (constants.go JobSetRestartReason is unused);
    each restart records RestartJobSetFailurePolicyAction (failure_policy.go
    restartJobSetActionApplier), and the events.k8s.io broadcaster folds the repeats into one
    event's series: count 2 is written at once, later counts lag (client-go tools/events
    recordToSink). So after the TTL a backend that never saw the JobSet counts 2 of its 3
    restarts from the series, and one that read status.restarts keeps 3."""
    backend = backend_for(kubeconfig)
    backend.submit(manifest("thrice", max_restarts=3))
    fail = {("0-0", attempt): (1, 42) for attempt in range(3)}
    ctl = JobSetController(api, Program(lines=2, line_every=0.01, fail=fail), ttl_after_finished=3600.0).start()
    api.wait_for(lambda: any(e["reason"] == "AllJobsCompleted" for e in api.events), timeout=30)
    assert backend.status("thrice").restarts == 3  # status.restarts, read live
    mine = [e for e in api.events if e["involvedObject"]["name"] == "thrice"]
    assert "Restarting" not in [e["reason"] for e in mine]
    (action,) = [e for e in mine if e["reason"] == "RestartJobSetFailurePolicyAction"]
    assert action["series"]["count"] == 2 and action["type"] == "Warning"
    assert action["message"] == "applying RestartJobSet failure policy action (first failed job: thrice-slice-0)"
    ctl.ttl_after_finished = 0.05
    api.wait_for(lambda: ("default", "thrice") not in api.jobsets)
    assert backend.status("thrice").restarts == 3
    assert backend_for(kubeconfig).status("thrice").restarts == 2
    assert restarts_from_events([{"reason": "Restarting", "count": 1}]) == 0


def test_the_first_rule_a_failed_job_matches_wins_over_the_job_that_failed_first(api, kubeconfig):
    """Job A (slice 1) fails first, restartably (rule 1: RestartJobSet on
    BackoffLimitExceeded); Job B (slice 0) fails 20 ms later with a bug (rule 0:
    FailOnUserError, FailJobSet on PodFailurePolicy). Each is Failed once its peer, deleted
    by the Job controller at FailureTarget, has exited (delayTerminalCondition); the JobSet
    controller syncs after both: findFirstFailedPolicyRuleAndJob tries rule 0 first, so the
    set fails naming B. Acting on A alone (no latency), the same failures restart it."""
    def two_rules(name: str) -> dict:
        obj = manifest(name, num_slices=2)
        obj["spec"]["failurePolicy"]["rules"].append(
            {"name": "RestartOnPreemption", "action": "RestartJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]})
        return obj

    def ended(name: str) -> dict:
        api.wait_for(lambda: any(c["type"] in ("Failed", "Completed") and c["status"] == "True"
                                 for c in api.jobsets[("default", name)]["status"].get("conditions", [])), timeout=20)
        return api.jobsets[("default", name)]["status"]

    program = Program(lines=20, line_every=0.01, fail={("1-0", 0): (1, 42), ("0-0", 0): (3, 1)})
    ctl = JobSetController(api, program, jobset_latency=0.15).start()
    backend_for(kubeconfig).submit(two_rules("same-sync"))
    st = ended("same-sync")
    assert st["restarts"] == 0
    (failed,) = [c for c in st["conditions"] if c["type"] == "Failed"]
    assert (failed["reason"], failed["message"]) == (
        "FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action (first failed job: same-sync-slice-0)")
    uid = api.jobsets[("default", "same-sync")]["metadata"]["uid"]
    a, b = ctl.jobs[(uid, 0, "same-sync-slice-1")], ctl.jobs[(uid, 0, "same-sync-slice-0")]
    assert (a["reason"], b["reason"]) == ("BackoffLimitExceeded", "PodFailurePolicy")
    assert a["failed_at"] < b["failed_at"]  # A failed first, and lost
    ctl.stop()
    ctl = JobSetController(api, program, jobset_latency=0.0).start()
    backend_for(kubeconfig).submit(two_rules("apart"))
    st = ended("apart")
    assert st["restarts"] == 1 and "Completed" in [c["type"] for c in st["conditions"] if c["status"] == "True"]
    reasons = [e["reason"] for e in api.events if e["involvedObject"]["name"] == "apart"]
    assert reasons[:2] == ["FailurePolicy_RestartOnPreemption", "RestartJobSetFailurePolicyAction"]
