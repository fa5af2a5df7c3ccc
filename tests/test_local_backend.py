"""The local backend runs the rendered JobSet as host processes with JobSet semantics.

The pods here run small shell commands (fast); the real training run is exercised by
tests/test_e2e_local.py.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml
from cli_helpers import REPO, pid_alive, xrun, xrun_popen

from manifests.spec import build_spec
from orchestrator.backends.local.backend import run_processes
from orchestrator.backends.local.supervisor import (
    SYNC_JOB_BATCH_SECONDS,
    failure_decision,
    plan_pods,
)
from xrun_contract.errors import XrunError as BackendError

BASE = ["--accelerator", "cpu-2", "--image", "local", "--max-restarts", "2"]


def meet_first(folder, host, count):
    """Shell: each pod marks ``folder`` with its ``host`` name and waits for ``count`` marks,
    so that tests timing exits against the 1 s sync start from pods that all run (under load
    one pod started over half a second after another)."""
    return f'touch {folder}/{host}; while [ "$(ls {folder} | wc -l)" -lt {count} ]; do sleep 0.05; done; '


def state_of(storage, name):
    return json.loads((storage / "runs" / name / "state.json").read_text())


def test_success_logs_status_list(tmp_path):
    store = tmp_path / "store"
    cmd = 'echo "host $XRUN_SLICE_INDEX-$XRUN_HOST_INDEX/$XRUN_HOSTS_PER_SLICE at $XRUN_COORDINATOR_ADDRESS"'
    r = xrun("submit", "--name", "ok", *BASE, "--command", cmd, "--follow", storage=store)
    assert r.returncode == 0, r.stderr
    # Both hosts' lines, prefixed, with the Downward-API values resolved per pod.
    assert "[0-0] host 0-0/2 at 127.0.0.1:" in r.stdout
    assert "[0-1] host 0-1/2 at 127.0.0.1:" in r.stdout
    assert "run ok: Succeeded" in r.stderr
    st = state_of(store, "ok")
    assert st["state"] == "Succeeded" and st["restarts"] == 0
    assert {h: v["exit_code"] for h, v in st["hosts"].items()} == {"0-0": 0, "0-1": 0}
    # Everything left in storage: manifest, run.json, logs per host.
    manifest = yaml.safe_load((store / "runs/ok/manifest.yaml").read_text())
    assert manifest["kind"] == "JobSet" and manifest["metadata"]["name"] == "ok"
    assert json.loads((store / "runs/ok/run.json").read_text())["spec"]["accelerator"] == "cpu-2"
    assert sorted(p.name for p in (store / "runs/ok/logs").iterdir()) == ["0-0", "0-1"]
    r = xrun("status", "ok", "-o", "json", storage=store)
    view = json.loads(r.stdout)
    assert view["state"] == "Succeeded" and [h["host"] for h in view["hosts"]] == ["0-0", "0-1"]
    r = xrun("logs", "ok", "--host", "0-1", storage=store)
    assert "[0-1] host 0-1/2" in r.stdout and "[0-0]" not in r.stdout
    assert r.stdout.strip().endswith("[0-1] EXIT_CODE=0")
    r = xrun("logs", "ok", "--tail-per-host", "1", "--no-prefix", storage=store)
    assert r.stdout.splitlines() == ["EXIT_CODE=0", "EXIT_CODE=0"]
    r = xrun("logs", "ok", "--tail", "1", "--no-prefix", storage=store)  # N lines in total
    assert r.stdout.splitlines() == ["EXIT_CODE=0"]
    r = xrun("list", "-o", "json", storage=store)
    assert [(x["name"], x["state"]) for x in json.loads(r.stdout)] == [("ok", "Succeeded")]
    # Same name again: refused (exit 2, nothing written) unless --replace.
    r = xrun("submit", "--name", "ok", *BASE, "--command", "true", "--detach", storage=store)
    assert r.returncode == 2 and "already exists" in r.stderr


def test_a_short_command_keeps_its_lines_when_the_shipper_starts_slowly(tmp_path):
    """Seen under a load of 10-19: ``--follow`` said Succeeded but printed no line of one
    host. Its log shipper got SIGTERM (the workload container ended: an echo, ~1 s with the
    launcher) while python still started (2-4 s measured at a load of 23), and SIGTERM's
    default action killed it before it had shipped a line. Here every shipper starts 3 s
    late (a sitecustomize); the launcher waits for it to take SIGTERM before it ends."""
    slow = tmp_path / "slow"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sys, time\n"
        "if sys.orig_argv[-2:] == ['workload.sidecar', 'ship']:\n"
        "    time.sleep(3)\n")
    store = tmp_path / "store"
    r = xrun("submit", "--name", "slowship", *BASE, "--command", 'echo "host $XRUN_HOST_INDEX"',
             "--follow", storage=store, PYTHONPATH=f"{REPO}:{slow}")
    assert r.returncode == 0, r.stderr
    for host in ("0-0", "0-1"):
        assert f"[{host}] host {host[-1]}" in r.stdout, r.stdout
        assert f"[{host}] EXIT_CODE=0" in r.stdout, r.stdout


def test_restartable_exit_restarts_whole_set(tmp_path):
    store = tmp_path / "store"
    cmd = ('echo "attempt $XRUN_RESTART_ATTEMPT"; '
           'if [ "$XRUN_RESTART_ATTEMPT" = 0 ] && [ "$XRUN_HOST_INDEX" = 1 ]; then exit 42; fi; '
           'if [ "$XRUN_RESTART_ATTEMPT" = 0 ]; then sleep 30; fi')
    r = xrun("submit", "--name", "rs", *BASE, "--command", cmd, "--follow", storage=store)
    assert r.returncode == 0, r.stderr
    st = state_of(store, "rs")
    assert st["state"] == "Succeeded" and st["restarts"] == 1
    walk = [t["state"] for t in st["transitions"]]
    assert walk == ["Running", "Restarting", "Running", "Succeeded"]
    assert "host 0-1 exited with code 42" in st["transitions"][1]["reason"]
    assert "[0-0 #1] attempt 1" in r.stdout and "[0-1 #1] attempt 1" in r.stdout
    # Host 0-0 was stopped by SIGTERM when 0-1 failed (it was sleeping 30 s).
    assert "[0-0] EXIT_CODE=143" in r.stdout


def test_logs_follow_picks_up_new_attempts(tmp_path):
    store = tmp_path / "store"
    cmd = ('echo "attempt $XRUN_RESTART_ATTEMPT begins"; sleep 2; '
           'if [ "$XRUN_RESTART_ATTEMPT" = 0 ]; then exit 42; fi; echo "attempt $XRUN_RESTART_ATTEMPT done"')
    r = xrun("submit", "--name", "lf", *BASE, "--command", cmd, "--detach", storage=store)
    assert r.returncode == 0, r.stderr
    r = xrun("logs", "lf", "-f", storage=store, timeout=120)  # returns when the run ends
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    for host in ("0-0", "0-1"):
        assert f"[{host}] attempt 0 begins" in lines
        assert f"[{host} #1] attempt 1 done" in lines
    attempt_lines = [x for x in lines if " attempt " in x and "xrun-wrapper" not in x]
    assert len(attempt_lines) == len(set(attempt_lines)) == 6  # no line shown twice
    assert state_of(store, "lf")["state"] == "Succeeded"


def test_non_restartable_exit_fails_run_naming_host_and_code(tmp_path):
    store = tmp_path / "store"
    cmd = 'if [ "$XRUN_HOST_INDEX" = 1 ]; then exit 3; fi; sleep 30'
    r = xrun("submit", "--name", "bad", *BASE, "--command", cmd, storage=store)
    assert r.returncode == 1
    st = state_of(store, "bad")
    assert st["state"] == "Failed" and st["restarts"] == 0
    assert "host 0-1 exited with code 3 (not restartable" in st["message"]
    assert "host 0-1 exited with code 3" in r.stderr


def test_non_restartable_exit_wins_over_a_peer_restartable_exit_a_moment_earlier(tmp_path):
    """A host that exits with a non-restartable code tears down the collective; its peer's
    restartable exit can land first. Both fall in one Job controller sync, where FailJob
    comes first: the run fails for good, naming the host that failed, not the peer.
    The hosts meet first (as in the slice-order test below): under load one pod started
    over half a second after the other, and the two exits fell into two syncs."""
    store, met = tmp_path / "store", tmp_path / "met"
    met.mkdir()
    cmd = (meet_first(met, "$XRUN_HOST_INDEX", "2")
           + 'if [ "$XRUN_HOST_INDEX" = 0 ]; then exit 42; fi; sleep 0.4; exit 3')
    r = xrun("submit", "--name", "tie", *BASE, "--command", cmd, storage=store)
    assert r.returncode == 1, r.stderr
    st = state_of(store, "tie")
    assert st["state"] == "Failed" and st["restarts"] == 0
    assert "host 0-1 exited with code 3 (not restartable" in st["message"]


def _failed_pods(manifest):
    def failed(*events):  # (slice, host, exit code, seconds after the first failure)
        pods = {(p.slice_index, p.host_index): p for p in plan_pods(manifest, 0, 1234)}
        out = []
        for s, h, code, at in events:
            pod = pods[(s, h)]
            pod.exit_code, pod.failed_container = code, pod.container
            pod.failed_at = pod.exited_at = 100.0 + at
            out.append(pod)
        return out
    return failed


def _decided(manifest, *events):
    d = failure_decision(manifest, _failed_pods(manifest)(*events))
    return d.action, f"{d.job.pod.slice_index}-{d.job.pod.host_index}", d.job.name


def test_failure_decision_mirrors_job_sync_batching_and_jobset_rule_order():
    from manifests.jobset import jobset

    spec = build_spec({"name": "d", "accelerator": "v6e-16", "num_slices": 2, "image": "i"}, {},
                      storage_default="/tmp/x")
    manifest = jobset(spec)
    inside = SYNC_JOB_BATCH_SECONDS / 2
    # Same Job, within one sync: the FailJob match decides, though it came second.
    assert _decided(manifest, (0, 0, 42, 0.0), (0, 1, 3, inside)) == ("FailJobSet", "0-1", "d-slice-0")
    # Same Job, a sync later: the first (restartable) failure has already failed the Job.
    late = SYNC_JOB_BATCH_SECONDS + 0.5
    assert _decided(manifest, (0, 0, 42, 0.0), (0, 1, 3, late)) == ("RestartJobSet", "0-0", "d-slice-0")
    # Two restartable exits: no rule matches; the default names the first failed Job.
    assert _decided(manifest, (1, 1, 137, 0.0), (0, 0, 42, 0.1)) == ("RestartJobSet", "1-1", "d-slice-1")
    # Job d-slice-1 failed first (restartably: no rule), d-slice-0 later in the same sync with
    # a bug (rule 0, FailOnUserError): JobSet's findFirstFailedPolicyRuleAndJob tries the
    # rules first, so rule 0 wins and the run fails naming d-slice-0.
    assert _decided(manifest, (1, 2, 42, 0.0), (0, 0, 3, inside)) == ("FailJobSet", "0-0", "d-slice-0")


def test_failure_decision_takes_the_first_rule_any_failed_job_matches():
    """Job A fails first and matches only rule 1; Job B fails later in the same sync and
    matches rule 0: rule 0's action wins (jobset failure_policy.go
    findFirstFailedPolicyRuleAndJob loops over the rules, then the Jobs). Among the Jobs a
    rule matches, the earliest failed is named."""
    from manifests.jobset import jobset

    spec = build_spec({"name": "r", "accelerator": "v6e-16", "num_slices": 3, "image": "i"}, {},
                      storage_default="/tmp/x")
    manifest = jobset(spec)
    manifest["spec"]["failurePolicy"]["rules"] = [
        {"name": "Rule0", "action": "RestartJobSetAndIgnoreMaxRestarts", "onJobFailureReasons": ["PodFailurePolicy"]},
        {"name": "Rule1", "action": "FailJobSet", "onJobFailureReasons": ["BackoffLimitExceeded"]},
    ]
    inside = SYNC_JOB_BATCH_SECONDS / 4
    events = ((2, 0, 42, 0.0), (1, 3, 3, inside), (0, 1, 3, 2 * inside))
    d = failure_decision(manifest, _failed_pods(manifest)(*events))
    assert (d.action, d.rule, d.job.name, d.job.reason) == (
        "RestartJobSetAndIgnoreMaxRestarts", "Rule0", "r-slice-1", "PodFailurePolicy")
    # Only A: rule 1.
    d = failure_decision(manifest, _failed_pods(manifest)(events[0]))
    assert (d.action, d.rule, d.job.name) == ("FailJobSet", "Rule1", "r-slice-2")
    # targetReplicatedJobs and onJobFailureMessagePatterns narrow a rule.
    manifest["spec"]["failurePolicy"]["rules"][0]["targetReplicatedJobs"] = ["other"]
    assert failure_decision(manifest, _failed_pods(manifest)(*events)).rule == "Rule1"
    manifest["spec"]["failurePolicy"]["rules"][0] = {
        "name": "Rule0", "action": "RestartJobSet", "onJobFailureMessagePatterns": ["exit code 3 "]}
    assert failure_decision(manifest, _failed_pods(manifest)(*events)).rule == "Rule0"


def test_a_bug_in_one_slice_fails_the_run_though_another_slice_failed_first(tmp_path):
    """Slice 1's host exits 42 (restartable: no rule) and slice 0's host exits 3 (a bug,
    FailOnUserError) 0.3 s later, in the same sync: the run fails at once naming 0-0,
    without a restart (the old order, the first failed Job, restarted and blamed 1-0).
    The hosts meet first: under load one pod started over a second after another, and the
    two exits fell into two syncs."""
    store, met = tmp_path / "store", tmp_path / "met"
    met.mkdir()
    cmd = (meet_first(met, "$XRUN_SLICE_INDEX-$XRUN_HOST_INDEX", "$((2 * XRUN_HOSTS_PER_SLICE))")
           + 'if [ "$XRUN_SLICE_INDEX-$XRUN_HOST_INDEX" = 1-0 ]; then exit 42; fi; '
           'if [ "$XRUN_SLICE_INDEX-$XRUN_HOST_INDEX" = 0-0 ]; then sleep 0.3; exit 3; fi; sleep 30')
    r = xrun("submit", "--name", "order", "--accelerator", "v6e-8", "--num-slices", "2", "--image", "i",
             "--max-restarts", "1", "--command", cmd, storage=store)
    assert r.returncode == 1, r.stderr
    st = state_of(store, "order")
    assert st["state"] == "Failed" and st["restarts"] == 0, st["message"]
    assert "host 0-0 exited with code 3 (not restartable" in st["message"]


def test_max_restarts_exhausted(tmp_path):
    store = tmp_path / "store"
    r = xrun("submit", "--name", "mr", "--accelerator", "cpu-1", "--image", "i",
             "--max-restarts", "1", "--command", "exit 42", storage=store)
    assert r.returncode == 1
    st = state_of(store, "mr")
    assert st["restarts"] == 1 and "maxRestarts 1 reached" in st["message"]


def test_delete_live_run_leaves_no_process(tmp_path):
    store = tmp_path / "store"
    # The pod's command leaves a grandchild (sleep) running in the background.
    r = xrun("submit", "--name", "live", *BASE, "--termination-grace-seconds", "2",
             "--command", "sleep 300 & echo child $!; wait", "--detach", storage=store)
    assert r.returncode == 0, r.stderr
    deadline = time.time() + 20
    pids = []
    while time.time() < deadline:
        st = state_of(store, "live")
        logs = xrun("logs", "live", "--no-prefix", storage=store).stdout
        children = [int(ln.split()[1]) for ln in logs.splitlines() if ln.startswith("child ")]
        if len(children) == 2 and all(h.get("pid") for h in st["hosts"].values()):
            pids = [st["supervisor_pid"], *[h["pid"] for h in st["hosts"].values()], *children]
            break
        time.sleep(0.3)
    assert len(pids) == 5 and all(pid_alive(p) for p in pids)
    assert json.loads(xrun("status", "live", "-o", "json", storage=store).stdout)["state"] == "Running"
    r = xrun("delete", "live", storage=store)
    assert r.returncode == 0 and "stopped live" in r.stderr
    time.sleep(0.5)
    assert [p for p in pids if pid_alive(p)] == []
    assert state_of(store, "live")["state"] == "Deleted"
    # --purge without a TTY needs --yes; with it the data is gone.
    r = xrun("delete", "live", "--purge", storage=store)
    assert r.returncode == 2 and "--yes" in r.stderr
    r = xrun("delete", "live", "--purge", "--yes", storage=store)
    assert r.returncode == 0 and not (store / "runs" / "live").exists()


def test_interrupt_when_not_interactive_detaches(tmp_path):
    store = tmp_path / "store"
    p = xrun_popen("submit", "--name", "ci", *BASE, "--command", "sleep 300", storage=store)
    deadline = time.time() + 20
    while time.time() < deadline and not (store / "runs/ci/state.json").exists():
        time.sleep(0.2)
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 130 and "detached" in err
    assert state_of(store, "ci")["state"] == "Running"
    assert xrun("delete", "ci", storage=store).returncode == 0
    assert state_of(store, "ci")["state"] == "Deleted"


def test_wrong_manifest_fails_locally_as_on_a_cluster():
    spec = build_spec({"name": "w", "accelerator": "cpu-2", "image": "i"}, {}, storage_default="/tmp/x")
    from manifests.jobset import jobset

    manifest = jobset(spec)
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "BAD",
                             "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['no-such-label']"}}})
    with pytest.raises(BackendError, match="no-such-label"):
        plan_pods(manifest, 0, 1234)


def test_pod_folders_live_only_while_their_pod_runs(tmp_path):
    """About 1,000 empty <name>-slice-*/xrun/ folders were left in /tmp by test runs: plan_pods
    made each pod's emptyDir folders when planning, so every plan that never ran (the many
    plans tests make, a manifest refused half-way through planning) left them behind. A
    plan now writes nothing; the pod's runner makes its folders and removes them."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    spec = build_spec({"name": "fold", "accelerator": "cpu-2", "image": "i"}, {}, storage_default="/tmp/x")
    from manifests.jobset import jobset

    manifest = jobset(spec)
    pods = plan_pods(manifest, 0, 1234, root=str(tmp))
    assert not list(tmp.iterdir()), sorted(p.name for p in tmp.rglob("*"))
    assert len(pods) == 2 and all(p.folder.startswith(f"{tmp}/fold-slice-0-") and p.volumes for p in pods)
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "BAD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['no']"}}})
    with pytest.raises(BackendError):
        plan_pods(manifest, 0, 1234, root=str(tmp))
    assert not list(tmp.iterdir())
    # That a run's pods have their folders and leave none: every local run, test_any_image.


def test_the_supervisor_exits_only_once_its_pods_folders_are_removed(tmp_path, monkeypatch):
    """A pod counts as ended before its runner removes its folder; the supervisor recorded
    Succeeded and exited while its (daemon) pod runners were still inside rmtree, leaving
    the folder, or its xrun/ emptied, in /tmp (seen after the 90 s outage test and the kill
    -9 loop). A pod that wrote many files into its emptyDir makes the removal long enough."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # the supervisor's temporary folder
    store = tmp_path / "store"
    cmd = 'mkdir "$XRUN_POD_DIR/many" && cd "$XRUN_POD_DIR/many" && seq 1 30000 | xargs touch'
    r = xrun("submit", "--name", "many", *BASE, "--command", cmd, "--follow", storage=store)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 30
    while run_processes(str(store), "many") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not run_processes(str(store), "many")
    assert not list(tmp.iterdir()), sorted(str(p.relative_to(tmp)) for p in tmp.glob("*/*"))


def test_plan_pods_resolves_env_like_kubernetes():
    spec = build_spec({"name": "p", "accelerator": "v6e-16", "num_slices": 2, "image": "i",
                       "env": {"A": "x$(XRUN_RUN_NAME)", "B": "$$(XRUN_RUN_NAME)"}}, {},
                      storage_default="/tmp/x")
    from manifests.jobset import jobset

    manifest = jobset(spec)
    # Raw manifest values get Kubernetes' $(VAR) expansion; xrun escapes user values so
    # they arrive exactly as written.
    container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "C", "value": "x$(XRUN_RUN_NAME)/$(NOPE)/$$(XRUN_RUN_NAME)"})
    pods = plan_pods(manifest, 3, 5555)
    assert [(p.slice_index, p.host_index) for p in pods] == [(s, h) for s in range(2) for h in range(4)]
    p = pods[5]
    assert p.env["XRUN_SLICE_INDEX"] == "1" and p.env["XRUN_HOST_INDEX"] == "1"
    assert p.env["MEGASCALE_SLICE_ID"] == "1" and p.env["XRUN_RESTART_ATTEMPT"] == "3"
    assert p.env["XRUN_COORDINATOR_ADDRESS"] == "127.0.0.1:5555"
    assert p.env["MEGASCALE_COORDINATOR_ADDRESS"] == "127.0.0.1"
    assert p.env["XRUN_PLATFORM"] == "cpu" and p.env["XRUN_DEVICES_PER_HOST"] == "4"
    assert p.env["A"] == "x$(XRUN_RUN_NAME)" and p.env["B"] == "$$(XRUN_RUN_NAME)"
    assert p.env["C"] == "xp/$(NOPE)/$(XRUN_RUN_NAME)"
    assert p.name.startswith("p-slice-1-1-") and len(p.name) == len("p-slice-1-1-") + 5


def test_gcs_root_logs_and_status_through_gcs(gcs_bucket, tmp_path):
    root = f"{gcs_bucket}/xrun"
    cmd = 'echo "hello from $XRUN_HOST_INDEX"'
    r = xrun("submit", "--name", "g", *BASE, "--command", cmd, "--storage", root, storage=root)
    assert r.returncode == 0, r.stderr
    r = xrun("logs", "g", storage=root)
    assert "[0-0] hello from 0" in r.stdout and "[0-1] hello from 1" in r.stdout
    view = json.loads(xrun("status", "g", "-o", "json", storage=root).stdout)
    assert view["state"] == "Succeeded" and view["storage"] == f"{root}/runs/g"
    from xrun_contract.storage import open_storage

    keys = [o.key for o in open_storage(root).list("runs/g", delimiter=None)[0]]
    assert "runs/g/state.json" in keys and "runs/g/manifest.yaml" in keys
    assert any(k.startswith("runs/g/logs/0-1/attempt-000/") for k in keys)


def test_interrupt_at_a_terminal_asks_and_can_stop(tmp_path):
    """At a terminal Ctrl-C asks: 'stop' ends the run and leaves no process behind."""
    import os
    import pty
    import subprocess
    import sys

    from cli_helpers import xrun_env

    store = tmp_path / "store"
    master, slave = pty.openpty()
    p = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "submit", "--name", "tty", *BASE,
         "--command", "sleep 300"],
        stdin=slave, stdout=slave, stderr=slave, env=xrun_env(store), close_fds=True,
    )
    os.close(slave)
    deadline = time.time() + 20
    while time.time() < deadline and not (store / "runs/tty/state.json").exists():
        time.sleep(0.2)
    while time.time() < deadline and not all(h.get("pid") for h in state_of(store, "tty")["hosts"].values() or [{}]):
        time.sleep(0.2)
    pids = [h["pid"] for h in state_of(store, "tty")["hosts"].values()]
    time.sleep(1)
    p.send_signal(signal.SIGINT)
    seen = b""
    while b"detach" not in seen and time.time() < deadline + 10:
        seen += os.read(master, 4096)
    assert b"Stop the run, or detach" in seen
    os.write(master, b"stop\n")
    assert p.wait(timeout=60) == 130
    os.close(master)
    assert state_of(store, "tty")["state"] == "Deleted"
    assert [x for x in pids if pid_alive(x)] == []


@pytest.mark.parametrize(("value", "root", "expected"), [
    (None, "/data/store", "/data/store/cache/jax-compilation"),  # the default: under the root
    ("1", "/data/store", "/data/store/cache/jax-compilation"),
    ("0", "/data/store", None),  # off
    ("/shared/jax", "/data/store", "/shared/jax"),  # one folder for every root
    ("/shared/jax", "gs://bucket/xrun", "/shared/jax"),
    (None, "gs://bucket/xrun", None),  # no cache of a gs:// root's own for local pods
])
def test_the_pods_compilation_cache_is_under_the_root_off_or_a_shared_folder(monkeypatch, value, root, expected):
    """XRUN_LOCAL_COMPILATION_CACHE: the tests' session shares one folder this way."""
    from types import SimpleNamespace

    from orchestrator.backends.local.supervisor import _compilation_cache

    if value is None:
        monkeypatch.delenv("XRUN_LOCAL_COMPILATION_CACHE", raising=False)
    else:
        monkeypatch.setenv("XRUN_LOCAL_COMPILATION_CACHE", value)
    storage = SimpleNamespace(root=root, url=lambda key: f"{root}/{key}")  # a root's url(): root/key
    assert _compilation_cache(storage) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "expected"), [
    (None, "gs://b/x/cache/jax-compilation"),  # the manifest's cache, in the bucket
    ("1", "gs://b/x/cache/jax-compilation"),
    ("0", "gs://b/x/cache/jax-compilation"),  # off: xrun adds none, the manifest's stays
    ("/shared/jax", "/shared/jax"),  # a folder wins over the manifest's too
])
def test_a_shared_cache_folder_wins_over_the_manifests_cache(monkeypatch, value, expected):
    """The main container's env (supervisor.main_env) for a gs:// root, whose manifest names
    its own cache: the tests' session folder must reach the pods all the same."""
    from types import SimpleNamespace

    from orchestrator.backends.local.supervisor import _compilation_cache, main_env
    from xrun_contract import Env

    if value is None:
        monkeypatch.delenv("XRUN_LOCAL_COMPILATION_CACHE", raising=False)
    else:
        monkeypatch.setenv("XRUN_LOCAL_COMPILATION_CACHE", value)
    storage = SimpleNamespace(root="gs://b/x", url=lambda key: f"gs://b/x/{key}")
    folder = _compilation_cache(storage)  # type: ignore[arg-type]
    cache = {Env.COMPILATION_CACHE: folder} if folder else {}
    pod = {Env.COMPILATION_CACHE: "gs://b/x/cache/jax-compilation", "A": "pod"}
    env = main_env({"A": "base", "B": "base"}, cache, pod)
    assert env[Env.COMPILATION_CACHE] == expected
    assert (env["A"], env["B"]) == ("pod", "base")
