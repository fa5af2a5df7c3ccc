"""xrun render: manifests right by construction for every shape, proven against real schemas."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from manifest_schemas import validate_jobset

from manifests import catalogue
from manifests.jobset import check_no_empty, jobset
from manifests.spec import RunSpec, build_spec, max_name_length
from orchestrator.cli import main
from xrun_contract import PodFiles
from xrun_contract.errors import XrunError

SHAPES = sorted(catalogue.shapes()) + ["cpu-1", "cpu-2", "cpu-4"]


def spec_for(shape: str, count: int, **extra) -> RunSpec:
    kind = catalogue.lookup(shape).kind
    values = {"name": "mt-07-eval", "accelerator": shape, "image": "example.com/xrun:1"}
    if kind == "tpu":
        values["num_slices"] = count
    elif kind == "gpu":
        values["nodes"] = count
    values.update(extra)
    if kind == "gpu" or kind == "tpu":
        values.setdefault("storage", "gs://bucket/runs")
    return build_spec(values, {}, storage_default="/tmp/xrun-test-storage")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("count", [1, 2, 4])
def test_every_shape_validates(shape, count):
    if shape.startswith("cpu") and count > 1:
        count = 1  # cpu shapes have one "slice"; hosts come from the name
    if count > 1 and catalogue.lookup(shape).kind == "tpu" and catalogue.lookup(shape).single_host:
        with pytest.raises(XrunError, match="single-host slice and GKE runs multislice only on multi-host"):
            spec_for(shape, count)
        return
    spec = spec_for(shape, count)
    obj = jobset(spec)
    validate_jobset(obj)
    check_no_empty(obj)
    s = catalogue.lookup(shape)
    rj = obj["spec"]["replicatedJobs"][0]
    job = rj["template"]["spec"]
    pod = job["template"]["spec"]
    hosts = count if s.kind == "gpu" else s.vms
    assert rj["replicas"] == (count if s.kind == "tpu" else 1)
    assert job["parallelism"] == job["completions"] == hosts
    assert job["completionMode"] == "Indexed" and job["backoffLimit"] == 0
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["XRUN_HOSTS_PER_SLICE"]["value"] == str(hosts)
    if s.kind == "tpu":
        assert pod["nodeSelector"] == {
            "cloud.google.com/gke-tpu-accelerator": s.gke_accelerator,
            "cloud.google.com/gke-tpu-topology": s.topology,
            "node.kubernetes.io/instance-type": s.machine_type,
        }
        assert s.machine_type.startswith(("ct6e-", "ct5lp-", "ct5p-", "ct4p-", "tpu7x-"))
        chips = str(s.devices_per_vm)
        assert pod["containers"][0]["resources"] == {
            "requests": {"google.com/tpu": chips}, "limits": {"google.com/tpu": chips},
        }
        assert obj["metadata"]["annotations"] == {
            "alpha.jobset.sigs.k8s.io/exclusive-topology": "cloud.google.com/gke-nodepool"
        }
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert ("MEGASCALE_NUM_SLICES" in env) == (count > 1)
    elif s.kind == "gpu":
        assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": s.gke_accelerator}
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
        assert not any(k.startswith("MEGASCALE") for k in env)
        assert "google.com/tpu" not in json.dumps(obj)
    else:
        assert "nodeSelector" not in pod and "resources" not in pod["containers"][0]


def test_v6e_catalogue_facts():
    expected = {
        "v6e-1": ("1x1", 1, 1), "v6e-4": ("2x2", 1, 4), "v6e-8": ("2x4", 2, 4), "v6e-8-single-host": ("2x4", 1, 8),
        "v6e-16": ("4x4", 4, 4), "v6e-32": ("4x8", 8, 4), "v6e-64": ("8x8", 16, 4),
        "v6e-128": ("8x16", 32, 4), "v6e-256": ("16x16", 64, 4),
    }
    for name, (topo, vms, chips) in expected.items():
        s = catalogue.lookup(name)
        assert (s.topology, s.vms, s.devices_per_vm) == (topo, vms, chips), name
        assert s.gke_accelerator == "tpu-v6e-slice"
        assert s.peak_bf16_tflops == 918 and s.hbm_gib == 32
    # v5p-N counts TensorCores: 2 per chip, 4 chips per VM.
    for name, s in catalogue.shapes().items():
        if s.family in ("v5p", "v4"):
            n = int(name.split("-")[1])
            assert s.vms * s.devices_per_vm * 2 == n, name
            dims = [int(d) for d in s.topology.split("x")]
            assert dims[0] * dims[1] * dims[2] == n // 2, name
        if s.family in ("v6e", "v5e"):
            dims = [int(d) for d in s.topology.split("x")]
            assert dims[0] * dims[1] == int(name.split("-")[1]) == s.vms * s.devices_per_vm


def test_issue_example_manifest():
    spec = build_spec(
        {}, {"name": "mt-07-eval", "accelerator": "v6e-32", "num_slices": 2, "image": "IMG",
             "command": "python3 -m workload.train --preset 1b", "queue": "team-a",
             "kueue_priority": "high", "max_restarts": 5, "storage": "gs://bkt/p"},
    )
    obj = jobset(spec)
    validate_jobset(obj)
    assert obj["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and obj["kind"] == "JobSet"
    assert obj["metadata"]["labels"] == {
        "xrun.dev/run": "mt-07-eval", "app.kubernetes.io/managed-by": "xrun",
        "kueue.x-k8s.io/queue-name": "team-a", "kueue.x-k8s.io/priority-class": "high",
    }
    s = obj["spec"]
    assert s["failurePolicy"]["maxRestarts"] == 5
    assert s["failurePolicy"]["rules"][0]["action"] == "FailJobSet"
    assert s["successPolicy"]["operator"] == "All"
    assert s["network"]["enableDNSHostnames"] is True
    # No spec.coordinator: JobSet >= 0.11 would put "<name>-slice-0-0.<name>" in a label (63
    # max) and cap run names at 26 characters; the workload gets the address from env.
    assert "coordinator" not in s
    assert s["ttlSecondsAfterFinished"] == 86400
    job = s["replicatedJobs"][0]["template"]["spec"]
    rule = job["podFailurePolicy"]["rules"][0]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "NotIn"
    assert rule["onExitCodes"]["values"] == [42, *range(127, 256)]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert "serviceAccountName" not in pod and "priorityClassName" not in pod
    assert "securityContext" not in pod["containers"][0]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                              {"name": "xrun", "emptyDir": {}}]
    # xrun's part comes from xrun's image: the launcher installer, then the log shipper (a
    # native sidecar); the user's container runs the launcher with /bin/sh only.
    init, logs = pod["initContainers"]
    assert init["name"] == "xrun-init" and "restartPolicy" not in init
    assert init["command"] == ["python3", "-m", "workload.sidecar", "install", "$(XRUN_POD_DIR)"]
    assert logs["name"] == "xrun-logs" and logs["restartPolicy"] == "Always"
    assert logs["command"] == ["python3", "-u", "-m", "workload.sidecar", "ship"]
    assert init["image"] == logs["image"] == "xrun-workload:0.1.0"
    assert pod["containers"][0]["command"] == [
        "/bin/sh", "$(XRUN_POD_DIR)/bin/xrun-launch", "python3 -m workload.train --preset 1b"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["XRUN_NUM_PROCESSES"]["value"] == "16"
    assert env["JAX_COORDINATOR_ADDRESS"]["value"] == "mt-07-eval-slice-0-0.mt-07-eval:8476"
    assert env["XRUN_HOST_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    assert env["XRUN_SLICE_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['jobset.sigs.k8s.io/job-global-index']"
    )
    assert env["MEGASCALE_SLICE_ID"]["valueFrom"] == env["XRUN_SLICE_INDEX"]["valueFrom"]
    assert env["XRUN_COORDINATOR_ADDRESS"]["value"] == "mt-07-eval-slice-0-0.mt-07-eval:8476"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"]["value"] == "mt-07-eval-slice-0-0.mt-07-eval"
    assert env["MEGASCALE_NUM_SLICES"]["value"] == "2"
    assert env["XRUN_NUM_SLICES"]["value"] == "2" and env["XRUN_HOSTS_PER_SLICE"]["value"] == "8"
    assert env["XRUN_STORAGE"]["value"] == "gs://bkt/p"


@pytest.mark.parametrize("image, policy", [
    ("us-docker.pkg.dev/p/r/xrun:latest", "Always"),
    ("xrun-workload", "Always"),  # no tag, no digest: Kubernetes reads it as :latest
    ("localhost:5000/xrun", "Always"),  # the port is the registry's, not a tag
    ("localhost:5000/xrun:1.2", "IfNotPresent"),
    ("us-docker.pkg.dev/p/r/xrun:abc123", "IfNotPresent"),
    ("us-docker.pkg.dev/p/r/xrun@sha256:" + "a" * 64, "IfNotPresent"),
    ("us-docker.pkg.dev/p/r/xrun:latest@sha256:" + "a" * 64, "Always"),
])
def test_image_pull_policy_as_kubernetes_defaults_it(image, policy):
    """core/v1 SetDefaults_Container: Always for :latest (and for a reference with neither
    tag nor digest, which parsers.ParseImageName reads as :latest), IfNotPresent otherwise;
    xrun's own containers follow xrun_image the same way."""
    for key in ("image", "xrun_image"):
        obj = jobset(spec_for("v6e-8", 1, **{key: image}))
        validate_jobset(obj)
        pod = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        rendered = {c["name"]: c["imagePullPolicy"] for c in pod["initContainers"] + pod["containers"]}
        other = "IfNotPresent"  # example.com/xrun:1 and xrun-workload:0.1.0: tagged
        want = {"xrun-init": policy if key == "xrun_image" else other,
                "xrun-logs": policy if key == "xrun_image" else other,
                "workload": policy if key == "image" else other}
        assert rendered == want, (key, image)


def test_optional_fields_appear_only_when_given():
    spec = spec_for("v6e-8", 1, service_account="trainer", priority_class="high-prio",
                    privileged=True, env={"EMPTY": "", "X": "1"})
    obj = jobset(spec)
    validate_jobset(obj)
    pod = obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "trainer"
    assert pod["priorityClassName"] == "high-prio"
    assert pod["containers"][0]["securityContext"] == {"privileged": True}
    env = pod["containers"][0]["env"]
    assert {"name": "EMPTY"} in env and {"name": "X", "value": "1"} in env


def test_name_length_limit_depends_on_shape():
    # v6e-256 x 4 slices: pod names <name>-slice-3-63-xxxxx
    spec = spec_for("v6e-256", 4)
    limit = max_name_length(spec)
    assert limit == 63 - len("-slice-3-63-xxxxx")
    ok = spec_for("v6e-256", 4, name="a" * limit)
    pod_name = f"{ok.name}-slice-3-63-abcde"
    assert len(pod_name) == 63
    rc, out, err = run_cli(["render", "--name", "a" * (limit + 1), "--tpu", "v6e-256",
                            "--num-slices", "4", "--image", "i"])
    assert rc == 2 and out == ""
    assert f"at most {limit}" in err


def run_cli(args: list[str]) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args],
                          capture_output=True, text=True, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


def test_render_cli_yaml_json_and_file(tmp_path):
    args = ["render", "--name", "mt-07-eval", "--tpu", "v6e-32", "--num-slices", "2",
            "--image", "IMG", "--command", "python3 -m workload.train --preset 1b"]
    rc, out, err = run_cli(args)
    assert rc == 0, err
    obj = yaml.safe_load(out)
    validate_jobset(obj)
    rc, out_json, _ = run_cli([*args, "-o", "json"])
    assert rc == 0 and json.loads(out_json) == obj
    target = tmp_path / "js.yaml"
    rc, out_file, _ = run_cli([*args, "--output-file", str(target)])
    assert rc == 0 and out_file == "" and yaml.safe_load(target.read_text()) == obj


def test_run_file_and_flags_override(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text(
        "name: from-file\naccelerator: v6e-16\nimage: img:1\nnum_slices: 2\n"
        "env:\n  A: '1'\n  B: two\nmax_restarts: 7\n"
    )
    rc, out, err = run_cli(["render", "-f", str(run), "--name", "from-flag", "--env", "B=3"])
    assert rc == 0, err
    obj = yaml.safe_load(out)
    assert obj["metadata"]["name"] == "from-flag"
    assert obj["spec"]["failurePolicy"]["maxRestarts"] == 7
    assert obj["spec"]["replicatedJobs"][0]["replicas"] == 2
    env = {e["name"]: e.get("value") for e in
           obj["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["A"] == "1" and env["B"] == "3"


def test_no_empty_fields_in_any_rendered_manifest():
    for shape in SHAPES:
        text = yaml.safe_dump(jobset(spec_for(shape, 1)))
        assert ": null" not in text and ": ''" not in text and "None" not in text, shape


HARMFUL = "echo 'single' \"double\" $HOME ${X} $(echo sub) `echo tick`; echo a\\b\nprintf '%s' \"$$\" ; echo 'end'"


def run_launcher(tmp_path, command: str, env: dict[str, str] | None = None,
                 shipper_ready: bool = True, **kw):
    """The user's container command as rendered, run here: the launcher installed by the
    init container's code, ``$(XRUN_POD_DIR)`` expanded as Kubernetes would. Started in its
    own session, as a container's PID 1 is (the launcher signals its process group).
    ``shipper_ready``: the log shipper's ready file is there (the launcher waits for it at
    its end), as a pod's shipper writes it within a second of starting."""
    from manifests.jobset import launcher_argv
    from orchestrator.backends.local.k8s_env import expand
    from workload.sidecar import install

    pod_dir = tmp_path / "pod"
    install(pod_dir)
    if shipper_ready:
        (pod_dir / PodFiles.SHIPPER_READY).write_text("")
    env = {"PATH": "/usr/bin:/bin", "XRUN_POD_DIR": str(pod_dir), **(env or {})}
    argv = [expand(a, env) for a in launcher_argv(command)]
    return subprocess.Popen(argv, env=env, cwd=str(tmp_path), start_new_session=True, **kw), pod_dir


def test_command_reaches_child_unchanged(tmp_path):
    """The launcher receives the command as one argv element; after Kubernetes' $-expansion
    (which the local backend reproduces) sh sees exactly the user's text, and the start
    line's JSON argv says exactly that."""
    from manifests.jobset import launcher_argv
    from orchestrator.backends.local.k8s_env import expand

    argv = [expand(a, {}) for a in launcher_argv(HARMFUL)]
    assert argv[-1] == HARMFUL and argv[0] == "/bin/sh"
    # Run it for real: the launcher runs sh -c CMD; CMD here echoes its own text back.
    probe = "cat <<'XRUN_EOF'\n" + HARMFUL + "\nXRUN_EOF"
    p, pod_dir = run_launcher(tmp_path, probe, stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0
    lines = (pod_dir / "output.log").read_text().splitlines()
    assert lines[0].startswith("xrun-wrapper: start host=0-0 attempt=0 argv=")
    assert json.loads(lines[0].split("argv=", 1)[1]) == ["/bin/sh", "-c", probe]
    assert (lines[-1] == "EXIT_CODE=0"
            and re.match(r"xrun-wrapper: end host=0-0 exit_code=0 seconds=\d+\.\d\d$", lines[-2]))
    assert "\n".join(lines[1:-2]) == HARMFUL
    assert out.splitlines() == lines  # kubectl logs shows the same (tail -f of the file)


def _session(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session ``sid`` (Linux /proc)."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
            if fields[0] != "Z" and int(fields[3]) == sid:
                found[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_launcher_stopped_while_starting_never_runs_the_command_and_leaves_nothing(tmp_path):
    """A SIGTERM that lands while the launcher is still starting (here: from inside its first
    `wc`, on PATH) is forwarded: the command never starts, the launcher reports 143 with
    its end lines, and nothing of the pod's session is left (the old launcher died there
    from the signal, before its trap, and could leave `tail -f`, which ignores TERM)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wc = bin_dir / "wc"
    wc.write_text("#!/bin/sh\n"
                  "read -r _ _ _ _ pgrp _ </proc/$$/stat\n"  # the launcher leads the group
                  "kill -TERM \"$pgrp\"\nsleep 0.5\nexec /usr/bin/wc \"$@\"\n")
    wc.chmod(0o755)
    ran = tmp_path / "ran"
    p, pod_dir = run_launcher(tmp_path, f"touch {ran}; sleep 300",
                              {"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert p.wait(timeout=20) == 143
    lines = (pod_dir / "output.log").read_text().splitlines()
    assert lines[-1] == "EXIT_CODE=143" and "exit_code=143" in lines[-2]
    assert not ran.exists()
    deadline = time.time() + 5
    while _session(p.pid) and time.time() < deadline:
        time.sleep(0.05)
    assert _session(p.pid) == {}


def test_launcher_killed_leaves_no_tail_behind(tmp_path):
    """kubectl logs' `tail -f` ignores TERM (it must print the last lines); with GNU tail it
    follows the launcher's pid, so even a SIGKILLed launcher does not leave it running."""
    p, pod_dir = run_launcher(tmp_path, "echo started; sleep 300")
    out = pod_dir / "output.log"
    deadline = time.time() + 20
    while "started" not in (out.read_text() if out.exists() else "") and time.time() < deadline:
        time.sleep(0.05)
    # The launcher starts its `tail -f` beside the command: on a loaded machine it can come
    # a moment after the command's first line.
    tails: list[int] = []
    while not tails and time.time() < deadline:
        tails = [pid for pid, cmd in _session(p.pid).items() if cmd.startswith("tail ")]
        time.sleep(0.05)
    assert len(tails) == 1, _session(p.pid)
    p.kill()
    p.wait(timeout=10)
    try:
        deadline = time.time() + 5
        while tails[0] in _session(p.pid) and time.time() < deadline:
            time.sleep(0.1)
        assert tails[0] not in _session(p.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the command: a runtime's job
            os.killpg(p.pid, signal.SIGKILL)


def test_launcher_ends_once_the_log_shipper_takes_sigterm(tmp_path):
    """The shipper gets SIGTERM when this container ends, and its default action killed a
    shipper still starting (2-4 s of python under load, an echo ends in ~1 s): the host's
    whole log was lost. The launcher's end waits for the shipper's ready file."""
    p, pod_dir = run_launcher(tmp_path, "echo hi", shipper_ready=False)
    out = pod_dir / PodFiles.OUTPUT
    deadline = time.time() + 20
    while "EXIT_CODE=0" not in (out.read_text() if out.exists() else "") and time.time() < deadline:
        time.sleep(0.05)
    assert "EXIT_CODE=0" in out.read_text()  # its lines are written: it waits after them
    with pytest.raises(subprocess.TimeoutExpired):
        p.wait(timeout=1.5)
    (pod_dir / PodFiles.SHIPPER_READY).write_text("")
    assert p.wait(timeout=10) == 0


def test_launcher_exit_code_and_sigterm_forwarding(tmp_path):
    p, pod_dir = run_launcher(tmp_path, "exit 7")
    assert p.wait(timeout=30) == 7
    assert (pod_dir / "output.log").read_text().splitlines()[-1] == "EXIT_CODE=7"
    # SIGTERM to the launcher only (what the kubelet signals: the container's PID 1) reaches
    # a grandchild (python under sh), which exits 42 from its handler.
    script = ("import signal,sys,time\n"
              "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
              "print('ready', flush=True)\ntime.sleep(30)\n")
    (tmp_path / "s.py").write_text(script)
    (tmp_path / "b").mkdir()
    p, pod_dir = run_launcher(tmp_path / "b", f"{sys.executable} {tmp_path / 's.py'}; echo after")
    out = pod_dir / "output.log"
    deadline = time.time() + 20
    while "ready" not in (out.read_text() if out.exists() else "") and time.time() < deadline:
        time.sleep(0.05)
    p.terminate()
    p.wait(timeout=20)
    last = out.read_text().splitlines()[-1]
    assert re.fullmatch(r"EXIT_CODE=\d+", last) and p.returncode == int(last.split("=")[1])
    # sh got SIGTERM too (it is in the group): the launcher reports what sh returned.
    assert p.returncode in (42, 143)


REPO = __import__("pathlib").Path(__file__).resolve().parent.parent


BAD_INPUTS = [
    (["--name", "a", "--tpu", "v6e-30", "--image", "i"], "did you mean v6e-32"),
    (["--name", "a", "--tpu", "v7x-8", "--image", "i"], "accelerator"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--num-slices", "0"], "num_slices: must be >= 1"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--num-slices", "-2"], "num_slices"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--num-slices", "two"], "--num-slices"),
    (["--name", "Bad", "--tpu", "v6e-8", "--image", "i"], "name: 'Bad' is not a DNS-1035"),
    (["--name", "1abc", "--tpu", "v6e-8", "--image", "i"], "DNS-1035"),
    (["--name", "abc-", "--tpu", "v6e-8", "--image", "i"], "DNS-1035"),
    (["--name", "a_b", "--tpu", "v6e-8", "--image", "i"], "DNS-1035"),
    (["--name", "a" * 60, "--tpu", "v6e-8", "--image", "i"], "characters; at most"),
    (["--tpu", "v6e-8", "--image", "i"], "name: required"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--env", "A=1", "--env", "A=2"], "duplicate env key 'A'"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--env", "1A=1"], "not a valid variable name"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--env", "A-B=1"], "not a valid variable name"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--env", "NOEQUALS"], "expected KEY=VALUE"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--env", "XRUN_RUN_NAME=x"], "set by xrun itself"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--command", "  "], "command: must not be empty"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--command", "echo 'open"], "command: cannot be parsed"),
    (["--name", "a", "--tpu", "v6e-8"], "image: required"),
    (["--name", "a", "--image", "i"], "accelerator: required"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--max-restarts", "-1"], "max_restarts: must be 0..100"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--restartable-exit-codes", "42,x"], "restartable_exit_codes"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--restartable-exit-codes", "0"], "restartable_exit_codes"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--storage", "s3://b/x"], "storage"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--nodes", "2"], "nodes: only for GPU"),
    (["--name", "a", "--accelerator", "h100-80gb-8", "--image", "i", "--num-slices", "2"], "multislice is for TPU"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--queue", "Bad Queue"], "queue"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--service-account", "Bad_SA"], "service_account"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "-o", "xml"], "--output"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--bogus"], "--bogus"),
    (["--name", "a", "--tpu", "cpu-0", "--image", "i"], "cpu hosts must be"),
    (["--name", "a", "--tpu", "v6e-8", "--image", "i", "--backend", "kube"], "gs://"),
]

BAD_RUN_FILES = [
    ("name: a\naccelerator: v6e-8\nimage: i\nslices: 2\n", "unknown key 'slices'"),
    ("- name: a\n- image: i\n", "must be a YAML mapping"),
    ("just a string\n", "must be a YAML mapping"),
    ("name: a\nname: b\naccelerator: v6e-8\nimage: i\n", "duplicate key 'name'"),
    ("name: a\naccelerator: v6e-8\nimage: i\nenv:\n  A: 1\n  A: 2\n", "duplicate key 'A'"),
    ("name: a\naccelerator: v6e-8\nimage: i\nenv: [A, B]\n", "env: must be a mapping"),
    ("name: a\naccelerator: v6e-8\nimage: i\nnum_slices: many\n", "num_slices: must be an integer"),
    ("name: a\naccelerator: v6e-8\nimage: i\nprivileged: maybe\n", "privileged: must be true or false"),
    ("name: a\naccelerator: v6e-8\nimage:\n", "image: empty value"),
    ("name: [a\n", "not valid YAML"),
    ("name: a\naccelerator: v6e-8\nimage: i\nenv:\n  A: {b: 1}\n", "env.A: must be"),
]


@pytest.mark.parametrize("args,needle", BAD_INPUTS)
def test_bad_flags_exit_2_one_line(args, needle, tmp_path, capsys):
    out_file = tmp_path / "out.yaml"
    rc = main(["render", *args, "--output-file", str(out_file)])
    out, err = capsys.readouterr()
    assert rc == 2, (args, err)
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    assert not out_file.exists()


@pytest.mark.parametrize("content,needle", BAD_RUN_FILES)
def test_bad_run_files_exit_2_one_line(content, needle, tmp_path, capsys):
    run = tmp_path / "run.yaml"
    run.write_text(content)
    rc = main(["render", "-f", str(run)])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err


def test_missing_run_file_and_env_file(tmp_path, capsys):
    assert main(["render", "-f", str(tmp_path / "nope.yaml")]) == 2
    assert "run file: cannot read" in capsys.readouterr().err
    ef = tmp_path / "e.env"
    ef.write_text("A=1\n# comment\nA=2\n")
    assert main(["render", "--name", "a", "--tpu", "v6e-8", "--image", "i", "--env-file", str(ef)]) == 2
    assert "duplicate env key 'A'" in capsys.readouterr().err
    ef.write_text("A=1\nexport B=2\n")
    assert main(["render", "--name", "a", "--tpu", "v6e-8", "--image", "i", "--env-file", str(ef),
                 "--env", "A=3"]) == 2
    assert "also in --env-file" in capsys.readouterr().err
    assert main(["render", "--name", "a", "--tpu", "v6e-8", "--image", "i", "--env-file", str(ef)]) == 0
    assert "name: B" in capsys.readouterr().out
