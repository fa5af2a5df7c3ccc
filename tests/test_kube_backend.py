"""KubeBackend against the scripted API server, through the real kubernetes client.

Every assertion is on what crossed the wire (request paths, query strings, bodies) or on
what the backend returned; the client is never patched.
"""

from __future__ import annotations

import threading
import time

import pytest
from kube_api import KubeAPI, make_pod, status

from manifests.jobset import jobset
from manifests.spec import build_spec
from orchestrator.backends.kube.backend import KubeBackend
from xrun_contract.errors import XrunError as BackendError

FORBIDDEN = ('jobsets.jobset.x-k8s.io is forbidden: User "dev@example.com" cannot create resource '
             '"jobsets" in API group "jobset.x-k8s.io" in the namespace "default"')
WEBHOOK = ('admission webhook "vjobset.kb.io" denied the request: spec.replicatedJobs[0].replicas: '
           'Invalid value: 0: must be greater than 0')


def backend_for(kubeconfig: str, namespace: str = "default", context: str | None = None) -> KubeBackend:
    return KubeBackend(context, namespace, kubeconfig, poll_seconds=0.05, watch_timeout_seconds=1)


def manifest(name: str, **extra) -> dict:
    """Two slices of one host each, small enough to script pod by pod. No catalogue shape is
    that (multislice needs multi-host slices: v6e-8 has 2 hosts), and a backend sends any
    manifest as it is, so the rendered v6e-8 x 2 is cut to one host per slice here."""
    flags = {"name": name, "accelerator": "v6e-8", "num_slices": 2, "image": "img:1",
             "storage": "gs://xrun-bucket/runs", "backend": "kube", **extra}
    obj = jobset(build_spec({}, flags))
    job = obj["spec"]["replicatedJobs"][0]["template"]["spec"]
    job["parallelism"] = job["completions"] = 1
    return obj


def test_submit_sends_the_rendered_body_and_status_walks_the_states(api, kubeconfig):
    name = "walk"
    unschedulable = "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."

    def pending_unschedulable(s: KubeAPI, n: str) -> None:
        for pod in s.set_pods(n, 0, "Pending", unschedulable=unschedulable):
            s.add_event("Pod", pod, "FailedScheduling", unschedulable)

    def pending_image(s: KubeAPI, n: str) -> None:
        s.set_pods(n, 0, "Pending", waiting="ImagePullBackOff")

    def host_failed(s: KubeAPI, n: str) -> None:
        s.put_pod(make_pod(n, 0, 0, 0, "Failed", exit_code=42))

    def restarting(s: KubeAPI, n: str) -> None:
        for pod in s.pods_of(n):
            pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            s.put_pod(pod)
        s.set_jobset_status(n, restarts=1)
        s.set_pods(n, 1, "Pending")

    def running_again(s: KubeAPI, n: str) -> None:
        for pod in s.pods_of(n):
            if pod["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] == "0":
                s.remove_pod(pod["metadata"]["name"])
        s.set_pods(n, 1, "Running")

    def succeeded(s: KubeAPI, n: str) -> None:
        s.set_pods(n, 1, "Succeeded")
        s.set_jobset_status(n, conditions=[
            {"type": "StartupPolicyCompleted", "status": "True", "reason": "AllReplicatedJobsStarted"},
            {"type": "Completed", "status": "True", "reason": "AllJobsCompleted", "message": "jobset completed successfully"},
        ])

    api.script([lambda s, n: None, pending_unschedulable, pending_image,
                lambda s, n: s.set_pods(n, 0, "Running"), host_failed, restarting, running_again, succeeded], hold=1)
    backend = backend_for(kubeconfig)
    body = manifest(name)
    backend.submit(body)
    (create,) = api.requests_to("POST", "/jobsets$")
    assert create.path == "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
    assert create.body == body

    seen = [backend.status(name) for _ in range(8)]
    states = [s.state for s in seen]
    assert states == ["Pending", "Pending", "Pending", "Running", "Running", "Restarting", "Running", "Succeeded"]
    # Why it is Pending: the scheduler's events and each pod's reason.
    assert seen[0].hosts == [] and seen[0].events == []
    assert [h.host for h in seen[1].hosts] == ["0-0", "1-0"]
    assert all(h.state == "Pending" and h.reason == f"Unschedulable: {unschedulable}" for h in seen[1].hosts)
    assert seen[1].events == [f"FailedScheduling (2 pods): {unschedulable}"]
    assert {h.reason.split(":")[0] for h in seen[2].hosts} == {"ImagePullBackOff"}
    # A host exits 42 while JobSet has not restarted yet: still Running, the host shows it.
    assert [(h.host, h.state, h.exit_code) for h in seen[4].hosts] == [("0-0", "Failed", 42), ("1-0", "Running", None)]
    # Restart: the newest attempt per host is shown, old pods still terminating are not.
    assert seen[5].restarts == 1 and seen[5].message == "restart 1/3"
    assert [(h.host, h.attempt, h.state) for h in seen[5].hosts] == [("0-0", 1, "Pending"), ("1-0", 1, "Pending")]
    assert [(h.host, h.attempt, h.state) for h in seen[6].hosts] == [("0-0", 1, "Running"), ("1-0", 1, "Running")]
    assert seen[7].message == "jobset completed successfully"
    assert [c["type"] for c in seen[7].conditions] == ["StartupPolicyCompleted", "Completed"]
    # Pods are found by the JobSet's label, the JobSet by name in the namespace.
    pod_lists = api.requests_to("GET", "^/api/v1/namespaces/default/pods$")
    assert {r.query["labelSelector"] for r in pod_lists} == {f"jobset.sigs.k8s.io/jobset-name={name}"}


def test_the_status_screen_is_the_local_one(api, kubeconfig, tmp_path):
    """The live view of a cluster run renders through orchestrator.screen like a local run."""
    from rich.console import Console

    from orchestrator.cli.screen import render_table
    from orchestrator.readers.loaders import read_stored_run
    from orchestrator.readers.view import run_view
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    backend = backend_for(kubeconfig)
    backend.submit(manifest("screen"))
    api.set_jobset_status("screen", restarts=1)
    api.set_pods("screen", 1, "Pending", waiting="ErrImagePull")
    storage = open_storage(str(tmp_path / "store"))
    storage.write_json(Layout.run_json("screen"), {"name": "screen", "backend": "kube", "spec": {"accelerator": "v6e-8"}})
    view = run_view(storage, read_stored_run(storage, "screen"), backend.status("screen"))
    console = Console(record=True, width=200)
    console.print(render_table(view))
    text = console.export_text()
    assert "Restarting   restarts 1   restart 1/3" in text
    assert "kube backend, v6e-8" in text
    assert "ErrImagePull" in text and "screen-slice-1-0-" in text


def test_kueue_suspended_jobset_is_pending_with_the_admission_event(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("queued", queue="lq"))
    api.set_jobset_status("queued", conditions=[{"type": "Suspended", "status": "True", "reason": "SuspendedByKueue"}])
    msg = "couldn't assign flavors to pod set slice: insufficient unused quota for google.com/tpu in flavor v6e, 8 more needed"
    api.add_event("Workload", "jobset-queued-3f2a1", "Pending", msg, etype="Normal")
    api.add_event("Pod", "someone-elses-pod", "FailedScheduling", "not about us")
    st = backend.status("queued")
    assert st.state == "Pending"
    assert st.message == "suspended: waiting for Kueue admission in queue lq"
    assert st.events == [f"Pending (workload/jobset-queued-3f2a1): {msg}"]


def test_submit_errors_are_one_line_with_exit_codes(api, kubeconfig, tmp_path):
    backend = backend_for(kubeconfig)
    body = manifest("errs")

    def error_of(fn, *args, **kwargs) -> BackendError:
        with pytest.raises(BackendError) as info:
            fn(*args, **kwargs)
        assert "\n" not in str(info.value)
        return info.value

    api.crd_installed = False
    e = error_of(backend.submit, body)
    assert e.exit_code == 1 and str(e).startswith("JobSet CRD not installed: jobset.x-k8s.io/v1alpha2 jobsets is not served")
    assert "kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/" in str(e)
    assert "JobSet CRD not installed" in str(error_of(backend.status, "errs"))
    api.crd_installed = True

    backend.submit(body)
    e = error_of(backend.submit, body)
    assert e.exit_code == 1
    assert str(e) == "jobsets.jobset.x-k8s.io 'errs' already exists in namespace 'default'; use --replace or another name"

    api.fail("POST", "/jobsets$", 403, status(403, "Forbidden", FORBIDDEN))
    e = error_of(backend.submit, manifest("rbac"))
    assert e.exit_code == 1
    assert str(e).startswith("forbidden: RBAC must allow verb 'create' on resource 'jobsets.jobset.x-k8s.io' "
                             "in namespace 'default' (context test-ctx): ")
    assert FORBIDDEN in str(e)

    api.fail("POST", "/jobsets$", 422, status(422, "Invalid", WEBHOOK))
    e = error_of(backend.submit, manifest("hooked"))
    assert e.exit_code == 1 and str(e) == f"jobsets.jobset.x-k8s.io 'hooked' rejected by the cluster (422 Invalid): {WEBHOOK}"

    api.fail("POST", "/jobsets$", 403, status(403, "Forbidden", 'admission webhook "kueue" denied the request: queue lq is stopped'))
    e = error_of(backend.submit, manifest("denied"))
    assert e.exit_code == 1 and "rejected by an admission webhook: admission webhook \"kueue\" denied" in str(e)

    e = error_of(backend_for(kubeconfig, "nope").submit, manifest("nons", namespace="nope"))
    assert e.exit_code == 1 and str(e) == "namespace 'nope' does not exist in context test-ctx"

    # A 5xx from the API server: tests/test_cluster_faults.py, through a fault proxy in front
    # of the real kube-apiserver.

    expired = str(api.kubeconfig(tmp_path / "expired", token="expired-token"))
    e = error_of(backend_for(expired).submit, body)
    assert e.exit_code == 3 and str(e).startswith("credentials rejected (401 Unauthorized) by http://127.0.0.1:")

    e = error_of(backend_for(kubeconfig, context="elsewhere").status, "errs")
    assert e.exit_code == 2 and str(e).startswith("--context: no context 'elsewhere' in kubeconfig")

    dead = KubeAPI().start()
    unreachable = str(dead.kubeconfig(tmp_path / "dead"))
    dead.stop()
    e = error_of(backend_for(unreachable).submit, body)
    assert e.exit_code == 3 and str(e).startswith("cannot reach the Kubernetes API at http://127.0.0.1:")
    # Nothing was created by any failed attempt.
    assert sorted(n for _, n in api.jobsets) == ["errs"]


def test_replace_deletes_in_the_foreground_then_creates(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("again"))
    api.set_pods("again", 0, "Running")
    backend.submit(manifest("again", command="python3 -m workload.train --preset tiny"), replace=True)
    calls = [(r.method, r.path.rsplit("/", 1)[-1]) for r in api.requests if r.method in ("POST", "DELETE")]
    assert calls == [("POST", "jobsets"), ("POST", "jobsets"), ("DELETE", "again"), ("POST", "jobsets")]
    (delete,) = api.requests_to("DELETE", "/jobsets/again$")
    assert delete.body == {"propagationPolicy": "Foreground"}
    # The delete waited for the pods to go before creating again.
    assert api.pods_of("again") == []
    posted = api.requests_to("POST", "/jobsets$")[-1].body
    assert "--preset tiny" in str(posted["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["command"])


def test_list_and_delete(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("one"))
    backend.submit(manifest("two"))
    api.set_pods("one", 0, "Running")
    api.set_jobset_status("one", replicatedJobsStatus=[{"name": "slice", "ready": 2, "active": 2}])
    api.set_jobset_status("two", conditions=[{"type": "Failed", "status": "True", "message": "jobset failed: pod exit 3"}])
    foreign = manifest("foreign")
    del foreign["metadata"]["labels"]["xrun.dev/run"]
    backend.submit(foreign)
    listed = {r["name"]: r for r in backend.list()}
    assert set(listed) == {"one", "two"}
    assert listed["one"]["state"] == "Running" and listed["two"]["state"] == "Failed"
    assert isinstance(listed["one"]["created"], float)
    (lst,) = api.requests_to("GET", "/jobsets$")
    assert lst.query["labelSelector"] == "xrun.dev/run"

    # --no-wait: returns while the pods are still there.
    assert backend.delete("one", wait=False) is True
    assert len(api.pods_of("one")) == 2
    api.wait_for(lambda: ("default", "one") not in api.jobsets)
    # Waiting: returns once the pods and the JobSet are gone.
    api.set_pods("two", 0, "Running")
    started = time.monotonic()
    assert backend.delete("two", wait=True) is True
    assert time.monotonic() - started >= 2 * api.delete_step_seconds
    assert api.pods_of("two") == [] and ("default", "two") not in api.jobsets
    assert backend.delete("two") is False  # already gone
    assert backend.status("two") is None
    assert {r.body["propagationPolicy"] for r in api.requests_to("DELETE", "/jobsets/")} == {"Foreground"}


def collect(backend: KubeBackend, name: str, out: list, errors: list, **kwargs) -> threading.Thread:
    def run() -> None:
        try:
            for item in backend.stream_logs(name, **kwargs):
                out.append(item)
        except BackendError as e:
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_logs_interleave_follow_a_restart_and_resume_dropped_streams(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("lg"))
    p00, p10 = api.set_pods("lg", 0, "Running")
    api.log(p00, "a-before")
    api.drop_watch_after["pods"] = 1  # the first pod watch dies after one event
    api.drop_log_after[p00] = 3  # p00's first follow stream dies after three lines
    out: list = []
    errors: list = []
    t = collect(backend, "lg", out, errors, follow=True)
    api.wait_for(lambda: len(api.requests_to("GET", "/log$")) == 2 and len(out) == 1)

    def say(pod: str, host: str, attempt: int, line: str) -> None:
        api.log(pod, line)
        api.wait_for(lambda: (host, attempt, line) in out)

    for i in range(3):
        say(p00, "0-0", 0, f"a{i}")
        say(p10, "1-0", 0, f"b{i}")
    # A restart: host 0-0 exits 42, JobSet deletes the attempt and creates attempt 1.
    api.put_pod(make_pod("lg", 0, 0, 0, "Failed", exit_code=42))
    api.set_jobset_status("lg", restarts=1)
    api.remove_pods("lg")
    q00, q10 = api.set_pods("lg", 1, "Pending")
    api.set_pods("lg", 1, "Running")
    for i in range(2):
        say(q00, "0-0", 1, f"c{i}")
        say(q10, "1-0", 1, f"d{i}")
    api.set_pods("lg", 1, "Succeeded")
    api.set_jobset_status("lg", conditions=[{"type": "Completed", "status": "True"}])
    t.join(timeout=15)
    assert not t.is_alive() and errors == []
    assert out == [
        ("0-0", 0, "a-before"),
        ("0-0", 0, "a0"), ("1-0", 0, "b0"), ("0-0", 0, "a1"), ("1-0", 0, "b1"), ("0-0", 0, "a2"), ("1-0", 0, "b2"),
        ("0-0", 1, "c0"), ("1-0", 1, "d0"), ("0-0", 1, "c1"), ("1-0", 1, "d1"),
    ]
    # p00's stream was cut after 3 lines; the resumed one (sinceSeconds, timestamps) replayed
    # them and the client dropped the repeats.
    p00_logs = [r for r in api.requests_to("GET", f"/pods/{p00}/log$") if r.query["follow"] == "true"]
    assert len(p00_logs) >= 2 and "sinceSeconds" not in p00_logs[0].query
    assert p00_logs[1].query["timestamps"] == "true" and int(p00_logs[1].query["sinceSeconds"]) >= 1
    assert [line for pod, conn, line in api.log_sent if pod == p00 and conn == 2][:3] == ["a-before", "a0", "a1"]
    # The pod watch was cut after one event and resumed from that event's resourceVersion.
    watches = [r for r in api.requests_to("GET", "^/api/v1/namespaces/default/pods$") if r.query.get("watch") == "true"]
    first_rv = int(watches[0].query["resourceVersion"])
    sent_first = [rv for kind, conn, rv in api.watch_sent if kind == "pods" and conn == 1]
    assert len(sent_first) == 1 and sent_first[0] > first_rv
    assert int(watches[1].query["resourceVersion"]) == sent_first[0]
    assert all(r.query["labelSelector"] == "jobset.sigs.k8s.io/jobset-name=lg" for r in watches)


def test_expired_watch_lists_again_and_tail_since_reach_the_server(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("gone"))
    p00, p10 = api.set_pods("gone", 0, "Running")
    api.log(p00, "x1", "x2", "x3")
    api.log(p10, "y1")
    api.expire_next_watches = 1
    out: list = []
    errors: list = []
    t = collect(backend, "gone", out, errors, follow=True, tail_lines=2, since_seconds=600)
    api.wait_for(lambda: sum(1 for r in api.requests_to("GET", "/pods$") if r.query.get("watch") == "true") >= 2)
    api.log(p10, "y2")
    api.wait_for(lambda: ("1-0", 0, "y2") in out)
    api.set_pods("gone", 0, "Succeeded")
    api.set_jobset_status("gone", conditions=[{"type": "Failed", "status": "True"}])
    t.join(timeout=15)
    assert not t.is_alive() and errors == []
    assert sorted(out) == [("0-0", 0, "x2"), ("0-0", 0, "x3"), ("1-0", 0, "y1"), ("1-0", 0, "y2")]
    firsts = [r.query for r in api.requests_to("GET", "/log$") if r.query["follow"] == "true"][:2]
    assert all(q["tailLines"] == "2" and q["sinceSeconds"] == "600" for q in firsts)
    # After the 410 the pods were listed again (a plain list between the two watches).
    kinds = ["watch" if r.query.get("watch") else "list" for r in api.requests_to("GET", "^/api/v1/namespaces/default/pods$")]
    assert kinds[:4] == ["list", "watch", "list", "watch"]


def test_logs_without_follow_read_each_pod_once(api, kubeconfig):
    backend = backend_for(kubeconfig)
    backend.submit(manifest("once"))
    p00, p10 = api.set_pods("once", 0, "Running")
    api.log(p00, "hello", "world")
    api.log(p10, "other")
    assert sorted(backend.stream_logs("once", hosts={"1-0"})) == [("1-0", 0, "other")]
    assert sorted(backend.stream_logs("once")) == [("0-0", 0, "hello"), ("0-0", 0, "world"), ("1-0", 0, "other")]
    assert all(r.query["follow"] == "false" for r in api.requests_to("GET", "/log$"))
    assert api.requests_to("GET", "/pods$")[-1].query.get("watch") is None


def test_cluster_logs_take_attempts_without_pods_from_storage(api, kubeconfig, tmp_path):
    from orchestrator.services.logs import log_lines as kube_log_lines
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    storage = open_storage(str(tmp_path / "store"))
    backend = backend_for(kubeconfig)
    backend.submit(manifest("mixed"))
    for host in ("0-0", "1-0"):  # what the pod wrapper shipped: attempt 0 (pods gone), attempt 1
        storage.write_text(Layout.log_chunk("mixed", host, 0, 0), f"{host} first try\n{host} exit 42\n")
        storage.write_text(Layout.log_chunk("mixed", host, 1, 0), f"{host} second try\n")
    api.set_jobset_status("mixed", restarts=1)
    q00, q10 = api.set_pods("mixed", 1, "Running")
    api.log(q00, "0-0 second try")
    api.log(q10, "1-0 second try")
    got = list(kube_log_lines(storage, "mixed", backend))
    assert got[:4] == [("0-0", 0, "0-0 first try"), ("0-0", 0, "0-0 exit 42"),
                       ("1-0", 0, "1-0 first try"), ("1-0", 0, "1-0 exit 42")]
    assert sorted(got[4:]) == [("0-0", 1, "0-0 second try"), ("1-0", 1, "1-0 second try")]  # from the pods, once
    assert len(api.requests_to("GET", "/log$")) == 2
    assert list(kube_log_lines(storage, "mixed", backend, tail=1, hosts={"1-0"})) == [("1-0", 1, "1-0 second try")]
    # The JobSet and its pods gone: everything comes from storage, even when following.
    api.remove_pods("mixed")
    api.jobsets.clear()
    got = list(kube_log_lines(storage, "mixed", backend, follow=True))
    assert [x[1] for x in got] == [0, 0, 0, 0, 1, 1] and ("1-0", 1, "1-0 second try") in got
    assert list(kube_log_lines(storage, "mixed", backend, tail=1, hosts={"0-0"})) == [("0-0", 1, "0-0 second try")]


def test_kube_logs_prints_prefixed_lines_and_one_line_errors(api, kubeconfig, tmp_path, capsys, monkeypatch):
    from orchestrator.cli import main
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    storage = open_storage(str(tmp_path / "store"))
    storage.write_json(Layout.run_json("pfx"), {"name": "pfx", "backend": "kube", "context": "test-ctx",
                                                "namespace": "default"})
    monkeypatch.setenv("KUBECONFIG", kubeconfig)

    def kube_logs(storage, name, backend, hosts, prefix=True):
        host_args = [a for h in hosts for a in ("--host", h)]
        return main(["logs", name, "--storage", storage.root, *host_args, *([] if prefix else ["--no-prefix"])])

    backend = backend_for(kubeconfig)
    backend.submit(manifest("pfx"))
    api.set_jobset_status("pfx", restarts=2)
    q00, _ = api.set_pods("pfx", 2, "Running")
    api.log(q00, "step 7")
    assert kube_logs(storage, "pfx", backend, hosts={"0-0"}) == 0
    assert capsys.readouterr().out == "[0-0 #2] step 7\n"
    assert kube_logs(storage, "pfx", backend, hosts={"0-0"}, prefix=False) == 0
    assert capsys.readouterr().out == "step 7\n"
    api.fail("GET", f"/pods/{q00}/log$", 403, status(403, "Forbidden", 'pods "x" is forbidden: cannot get resource "pods/log"'))
    assert kube_logs(storage, "pfx", backend, hosts={"0-0"}) == 1
    err = capsys.readouterr().err
    assert err.startswith("xrun: error: forbidden: RBAC must allow verb 'get' on resource 'pods/log' in namespace 'default'")
    assert err.count("\n") == 1


def test_self_signed_tls_api_server(tmp_path):
    """The client verifies the server against the kubeconfig's CA; without it, exit 3."""
    server = KubeAPI().start(tls=True)
    try:
        assert server.url.startswith("https://127.0.0.1:")
        trusted = str(server.kubeconfig(tmp_path / "trusted"))
        backend = backend_for(trusted)
        spec = build_spec({"name": "tls", "accelerator": "v6e-8", "image": "i",
                           "storage": "gs://bkt/x"}, {})
        manifest = jobset(spec)
        backend.submit(manifest)
        (post,) = server.requests_to("POST", "/jobsets$")
        assert post.body == manifest
        assert [j["name"] for j in backend.list()] == ["tls"]
        untrusted = str(server.kubeconfig(tmp_path / "untrusted", trust_ca=False))
        with pytest.raises(BackendError) as err:
            backend_for(untrusted).list()
        assert err.value.exit_code == 3 and "CERTIFICATE_VERIFY_FAILED" in str(err.value)
        assert "\n" not in str(err.value)
        assert len(server.requests_to("GET", "/jobsets")) == 1  # the untrusted call never arrived
    finally:
        server.stop()


# --- an init container's failure is shown as itself ----------------------------------------

PULL_DENIED = ('failed to pull and unpack image "docker.io/library/xrun-workload:0.1.0": failed to resolve reference '
               '"docker.io/library/xrun-workload:0.1.0": pull access denied, repository does not exist or may '
               'require authorization: server message: insufficient_scope: authorization failed')


def _ctr(name: str, image: str, state: dict, **extra) -> dict:
    return {"name": name, "image": image, "imageID": "", "ready": False, "restartCount": 0, "started": False,
            "state": state, "lastState": {}, **extra}


def _stuck_pod(name: str, init_states: list[dict]) -> dict:
    """A pod as the kubelet reports it while an init container cannot start (kubectl get pod
    shows Init:ErrImagePull and the like): Pending, scheduled, Initialized False, the
    workload container waiting on PodInitializing."""
    pod = make_pod(name, 0, 0, 0, "Running")
    pod["spec"]["initContainers"] = [{"name": "xrun-init", "image": "xrun-workload:0.1.0"},
                                     {"name": "xrun-logs", "image": "xrun-workload:0.1.0", "restartPolicy": "Always"}]
    pending = [c["name"] for c, s in zip(pod["spec"]["initContainers"], init_states, strict=True)
               if "terminated" not in s]
    pod["status"] = {
        "phase": "Pending", "hostIP": "10.128.0.7", "podIP": "10.8.0.12", "qosClass": "Burstable",
        "startTime": "2026-12-04T20:00:00Z",
        "conditions": [
            {"type": "PodReadyToStartContainers", "status": "True"},
            {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
             "message": f"containers with incomplete status: [{' '.join(pending)}]"},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
             "message": "containers with unready status: [workload xrun-logs]"},
            {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
             "message": "containers with unready status: [workload xrun-logs]"},
            {"type": "PodScheduled", "status": "True"}],
        "initContainerStatuses": [_ctr(c["name"], c["image"], s)
                                  for c, s in zip(pod["spec"]["initContainers"], init_states, strict=True)],
        "containerStatuses": [_ctr("workload", "img:1", {"waiting": {"reason": "PodInitializing"}})],
    }
    return pod


INIT_DONE = {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-12-04T20:00:03Z",
                            "finishedAt": "2026-12-04T20:00:04Z", "containerID": "containerd://abc"}}
INITIALIZING = {"waiting": {"reason": "PodInitializing"}}
STUCK = [
    ([{"waiting": {"reason": "ErrImagePull", "message": PULL_DENIED}}, INITIALIZING],
     f"ErrImagePull: init container xrun-init: {PULL_DENIED}"),
    ([{"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "xrun-workload:0.1.0"'}},
      INITIALIZING],
     'ImagePullBackOff: init container xrun-init: Back-off pulling image "xrun-workload:0.1.0"'),
    ([INIT_DONE, {"waiting": {"reason": "CreateContainerConfigError",
                              "message": 'secret "gcs-key" not found'}}],
     'CreateContainerConfigError: init container xrun-logs: secret "gcs-key" not found'),
]


@pytest.mark.parametrize("init_states, reason", STUCK, ids=["ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError"])
def test_init_container_failures_show_as_themselves(api, kubeconfig, tmp_path, init_states, reason):
    """xrun-init or the xrun-logs native sidecar cannot start: `xrun status` names it and
    the kubelet's reason and message, not the workload's PodInitializing."""
    import json

    from cli_helpers import xrun

    from orchestrator.backends.kube.state import host_status, one_line
    from xrun_contract import Layout
    from xrun_contract.storage import open_storage

    backend = backend_for(kubeconfig)
    backend.submit(manifest("stuck"))
    pod = _stuck_pod("stuck", init_states)
    shown = one_line(reason, 160)  # the status screen's width for a reason
    assert host_status(pod).reason == shown
    api.put_pod(pod)
    root = tmp_path / "store"
    open_storage(str(root)).write_json(Layout.run_json("stuck"), {
        "name": "stuck", "backend": "kube", "context": "test-ctx", "namespace": "default",
        "spec": {"accelerator": "v6e-8"}})
    r = xrun("status", "stuck", "-o", "json", storage=root, timeout=60, KUBECONFIG=kubeconfig)
    assert r.returncode == 0, r.stderr
    (host,) = json.loads(r.stdout)["hosts"]
    assert (host["host"], host["state"], host["reason"]) == ("0-0", "Pending", shown)
    r = xrun("status", "stuck", storage=root, timeout=60, KUBECONFIG=kubeconfig, COLUMNS="400")
    assert r.returncode == 0 and shown in r.stdout, r.stdout
