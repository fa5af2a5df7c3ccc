"""workdir (issue #30): the working tree shipped through storage and run from in the pod.

Packing is checked on real git checkouts (git's own ls-files decides what is in), the upload
on fake-gcs-server (no second upload of an unchanged tree: same objects, same generation),
and the pod side with real local runs: the command runs in the unpacked archive, never in
the live tree, and a run on the real control plane is admitted with the init container's
download in it.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from cli_helpers import xrun

from orchestrator.services import code
from orchestrator.workdir import pack
from xrun_contract import Env, Layout
from xrun_contract.errors import XrunError
from xrun_contract.storage import open_storage


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}).stdout.strip()


def make_repo(path: Path, files: dict[str, str], branch: str = "main") -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", branch)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "first")
    return path


def test_archive_is_deterministic_and_follows_git(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train.py": "print('hi')\n", "pkg/mod.py": "X = 1\n",
                                         ".gitignore": "out/\n*.log\n", "run.sh": "echo\n"})
    (repo / "run.sh").chmod(0o755)
    git(repo, "commit", "-qam", "exec bit")
    (repo / "out").mkdir()
    (repo / "out" / "big.bin").write_bytes(b"x" * 1000)  # .gitignored folder
    (repo / "debug.log").write_text("ignored\n")
    (repo / "new.py").write_text("untracked but not ignored\n")
    first = pack(str(repo))
    assert first.files == [".gitignore", "new.py", "pkg/mod.py", "run.sh", "train.py"]
    assert first.git is not None and first.git.commit == git(repo, "rev-parse", "HEAD")
    assert first.git.branch == "main" and first.git.dirty and len(first.git.diff_sha256) == 64
    # Same tree, new mtimes: same bytes, same name.
    os.utime(repo / "train.py", (1, 1))
    assert pack(str(repo)).sha256 == first.sha256
    # One file changed: another archive; and the dirty diff's hash changes with it.
    (repo / "pkg" / "mod.py").write_text("X = 2\n")
    second = pack(str(repo))
    assert second.sha256 != first.sha256 and second.git is not None
    assert second.git.diff_sha256 != first.git.diff_sha256
    # The entries: sorted, fixed owner and time, exec bit kept, relative names.
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(second.data), mode="r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == second.files
    assert {(m.uid, m.gid, m.mtime, m.uname) for m in members} == {(0, 0, 0, "")}
    assert {m.name: m.mode for m in members}["run.sh"] == 0o755
    assert {m.name: m.mode for m in members}["train.py"] == 0o644
    # Committed and clean: not dirty, no diff hash.
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "all")
    clean = pack(str(repo))
    assert clean.git is not None and not clean.git.dirty and clean.git.diff_sha256 == ""


def test_credentials_and_size_are_refused_unless_allowed(tmp_path):
    repo = make_repo(tmp_path / "repo", {"train.py": "x\n", "certs/server.pem": "k\n", ".env": "A=1\n",
                                         "credentials-prod.json": "{}\n", "notes.txt": "n\n"})
    with pytest.raises(XrunError) as e:
        pack(str(repo))
    assert e.value.exit_code == 2
    assert "certs/server.pem" in str(e.value) and ".env" in str(e.value) and "credentials-prod.json" in str(e.value)
    assert "notes.txt" not in str(e.value)
    # Allowed by .xrunignore's [allow] section and by --allow-file; left out by its patterns.
    (repo / ".xrunignore").write_text("# ship the test cert\ncredentials-*.json\n[allow]\ncerts/*.pem\n")
    assert "--allow-file" in str(pytest.raises(XrunError, pack, str(repo)).value)  # .env still there
    packed = pack(str(repo), allow_files=[".env"])
    assert packed.files == [".env", ".xrunignore", "certs/server.pem", "notes.txt", "train.py"]
    assert packed.left_out == ["credentials-prod.json"]
    # Over the size limit: exit 2 naming the five largest.
    for i in range(6):
        (repo / f"data{i}.bin").write_bytes(b"\0" * (200_000 + i * 1000))
    with pytest.raises(XrunError) as e:
        pack(str(repo), max_mb=1, allow_files=[".env"])
    msg = str(e.value)
    assert e.value.exit_code == 2 and "over the 1 MB limit" in msg
    assert [n for n in (f"data{i}.bin" for i in range(6)) if n in msg] == [f"data{i}.bin" for i in range(1, 6)]
    # A symlink out of the tree is refused; outside git, .xrunignore still applies.
    plain = tmp_path / "plain"
    (plain / "src").mkdir(parents=True)
    (plain / "src" / "a.py").write_text("a\n")
    (plain / "cache").mkdir()
    (plain / "cache" / "x").write_text("x\n")
    (plain / ".xrunignore").write_text("cache/\n")
    assert pack(str(plain)).files == [".xrunignore", "src/a.py"] and pack(str(plain)).git is None
    (plain / "escape").symlink_to("/etc/passwd")
    with pytest.raises(XrunError, match="escape is a symlink to '/etc/passwd', outside the tree"):
        pack(str(plain))


def test_an_unchanged_tree_is_not_uploaded_again(tmp_path, gcs_bucket):
    """On fake-gcs-server, through the CLI: the pod downloads the tree from GCS, and a second
    submit of the unchanged tree writes no archive (same objects, sizes and generations)."""
    from xrun_contract.storage import gcs_client

    repo = make_repo(tmp_path / "repo", {"only_here.txt": "from the bucket\n"})
    root = gcs_bucket + "/xr"

    def archives():
        return {b.name: (b.size, b.generation) for b in gcs_client().list_blobs(gcs_bucket[5:], prefix="xr/code/")}

    def submit(name: str):
        return xrun("submit", "--name", name, "--accelerator", "cpu-1", "--image", "local", "--workdir", str(repo),
                    "--command", "cat only_here.txt", "--follow", storage=root, XDG_STATE_HOME=str(tmp_path / "state"))

    first = submit("wd-gcs-1")
    assert first.returncode == 0, first.stderr
    assert "from the bucket" in first.stdout and "uploaded" in first.stderr
    before = archives()
    sha = pack(str(repo)).sha256
    assert list(before) == [f"xr/{Layout.code(sha)}"]
    second = submit("wd-gcs-2")
    assert second.returncode == 0 and "already in storage" in second.stderr, second.stderr
    assert "from the bucket" in second.stdout
    assert archives() == before  # no new object, none rewritten (same generation)
    (repo / "only_here.txt").write_text("changed\n")
    changed = pack(str(repo))
    assert changed.sha256 != sha
    assert code.upload(open_storage(root), changed) is True and len(archives()) == 2


CMD = ('cat only_here.txt; echo "cwd=$(pwd)"; python3 -c "import helper; print(helper.WHO)"; '
       'touch "$SIGNALS/started"; while [ ! -e "$SIGNALS/go" ]; do sleep 0.1; done; '
       'cat only_here.txt; ls')


@pytest.fixture(scope="module")
def shipped_runs(tmp_path_factory):
    """Two runs of one tree (the second after editing the tree mid-run) and a third of another."""
    tmp = tmp_path_factory.mktemp("workdir")
    store, signals = tmp / "store", tmp / "signals"
    signals.mkdir()
    repo = make_repo(tmp / "repo", {"only_here.txt": "shipped v1\n", "helper.py": "WHO = 'helper from the tree'\n",
                                    ".gitignore": "secret.txt\n"})
    (repo / "secret.txt").write_text("never shipped\n")
    run_file = tmp / "run.yaml"
    run_file.write_text(yaml.safe_dump({"name": "wd-a", "accelerator": "cpu-1", "image": "local", "command": CMD,
                                        "workdir": "repo", "env": {"SIGNALS": str(signals)}}))
    a = xrun("submit", "-f", str(run_file), "--detach", storage=store)
    deadline = time.monotonic() + 60
    while not (signals / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    # Edit the live tree while the pod runs: the pod must not see it.
    (repo / "only_here.txt").write_text("edited during the run\n")
    (repo / "added.txt").write_text("new\n")
    (signals / "go").touch()
    wait_a = xrun("wait", "wd-a", "--timeout", "60", storage=store)
    logs_a = xrun("logs", "wd-a", "--no-prefix", storage=store)
    # The edited tree: another archive; the same tree again: no upload.
    b = xrun("submit", "-f", str(run_file), "--name", "wd-b", "--follow", storage=store)
    c = xrun("submit", "-f", str(run_file), "--name", "wd-c", "--follow", storage=store)
    return {"store": store, "repo": repo, "a": a, "wait_a": wait_a, "logs_a": logs_a, "b": b, "c": c}


def test_the_pod_runs_in_the_shipped_tree_not_the_live_one(shipped_runs):
    r = shipped_runs
    assert r["a"].returncode == 0, r["a"].stderr
    assert r["wait_a"].returncode == 0, r["wait_a"].stderr
    out = r["logs_a"].stdout
    # The file exists only in the shipped tree (the pod's cwd is its unpacked copy), the
    # tree's module imports (first on PYTHONPATH), and the edit made mid-run is not seen.
    assert out.count("shipped v1") == 2 and "edited during the run" not in out, out
    assert "helper from the tree" in out
    assert "/xrun/code" in out or "cwd=" in out and str(r["repo"]) not in out
    listed = out.split("shipped v1")[-1]
    assert "helper.py" in listed and "added.txt" not in listed and "secret.txt" not in listed
    assert "secret.txt" not in out


def test_run_json_records_the_tree_and_repeats_share_one_archive(shipped_runs):
    r, store = shipped_runs, shipped_runs["store"]
    assert r["b"].returncode == 0 and r["c"].returncode == 0, r["b"].stderr + r["c"].stderr
    recs = {n: json.loads((store / "runs" / n / "run.json").read_text()) for n in ("wd-a", "wd-b", "wd-c")}
    head = git(r["repo"], "rev-parse", "HEAD")
    a, b, c = (recs[n]["code"] for n in ("wd-a", "wd-b", "wd-c"))
    assert a["git"] == {"commit": head, "branch": "main", "dirty": False, "diff_sha256": ""}
    assert b["git"]["commit"] == head and b["git"]["dirty"] and len(b["git"]["diff_sha256"]) == 64
    assert a["sha256"] != b["sha256"] == c["sha256"]
    assert a["uploaded"] and b["uploaded"] and not c["uploaded"]
    assert recs["wd-a"]["spec"]["commit"] == head and recs["wd-a"]["spec"]["branch"] == "main"
    assert "already in storage" in r["c"].stderr
    assert (sorted(p.name for p in (store / "code").iterdir())
            == sorted(f"{s}.tar.gz" for s in (a["sha256"], b["sha256"])))
    manifest = yaml.safe_load((store / "runs" / "wd-a" / "manifest.yaml").read_text())
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    init_env = {e["name"]: e.get("value") for e in pod["initContainers"][0]["env"]}
    assert init_env[Env.CODE_SHA256] == a["sha256"] and init_env[Env.STORAGE] == str(store)
    # status shows where the code came from.
    st = xrun("status", "wd-b", storage=store)
    assert st.returncode == 0, st.stderr
    assert f"code {b['sha256'][:12]}" in st.stdout and head[:7] in st.stdout and "dirty" in st.stdout, st.stdout
    js = json.loads(xrun("status", "wd-b", "-o", "json", storage=store).stdout)
    assert js["code"]["sha256"] == b["sha256"] and js["code"]["git"]["dirty"] is True


def test_purge_keeps_a_named_archive_and_gc_removes_the_rest(shipped_runs):
    store = shipped_runs["store"]
    shas = {n: json.loads((store / "runs" / n / "run.json").read_text())["code"]["sha256"] for n in ("wd-a", "wd-b")}
    archives = lambda: sorted(p.name.removesuffix(".tar.gz") for p in (store / "code").iterdir())  # noqa: E731
    # wd-c names wd-b's archive: purging wd-b keeps it; purging wd-a removes wd-a's.
    r = xrun("delete", "wd-b", "--purge", "--yes", storage=store)
    assert r.returncode == 0, r.stderr
    assert shas["wd-b"] in archives() and "workdir archive" not in r.stderr
    r = xrun("delete", "wd-a", "--purge", "--yes", storage=store)
    assert r.returncode == 0 and f"code/{shas['wd-a']}.tar.gz" in r.stderr, r.stderr
    assert archives() == [shas["wd-b"]]
    # An archive no run names: gc --dry-run lists it, gc removes it; named ones stay.
    orphan = "0" * 64
    (store / "code" / f"{orphan}.tar.gz").write_bytes(b"x")
    os.utime(store / "code" / f"{orphan}.tar.gz", (time.time() - 7200, time.time() - 7200))
    dry = xrun("gc", "--dry-run", storage=store)
    assert dry.returncode == 0 and f"would remove code/{orphan}.tar.gz" in dry.stdout, dry.stderr
    assert orphan in archives()
    done = xrun("gc", storage=store)
    assert done.returncode == 0 and f"removed code/{orphan}.tar.gz" in done.stdout
    assert archives() == [shas["wd-b"]]
    bad = xrun("gc", "--grace", "-1", storage=store)
    assert bad.returncode == 2


def test_a_bad_workdir_is_exit_2_and_nothing_is_written(tmp_path):
    store = tmp_path / "store"
    repo = make_repo(tmp_path / "repo", {"id_rsa": "k\n", "a.py": "\n"})
    r = xrun("submit", "--name", "wd-bad", "--accelerator", "cpu-1", "--image", "local",
             "--workdir", str(repo), "--command", "true", storage=store)
    assert r.returncode == 2 and "id_rsa" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not store.exists()
    r = xrun("submit", "--name", "wd-bad", "--accelerator", "cpu-1", "--image", "local",
             "--workdir", str(tmp_path / "nope"), "--command", "true", storage=store)
    assert r.returncode == 2 and "workdir:" in r.stderr and not store.exists()


def test_a_workdir_manifest_is_admitted_by_the_real_cluster(cluster, tmp_path):
    from cluster_helpers import NAMESPACE, unique
    from test_admission_real import server_verdict

    repo = make_repo(tmp_path / "repo", {"train.py": "print(1)\n"})
    name = unique("wd")
    r = xrun("render", "--name", name, "--accelerator", "v6e-8", "--image", "python:3.12",
             "--xrun-image", "us-docker.pkg.dev/p/r/xrun-workload:1", "--workdir", str(repo),
             "--command", "python3 train.py", "-o", "json", storage="gs://bucket/xr")
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert server_verdict(cluster, obj) is None
    created = cluster.custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NAMESPACE, "jobsets", obj)
    pod = created["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    init = next(c for c in pod["initContainers"] if c["name"] == "xrun-init")
    env = {e["name"]: e.get("value") for e in init["env"]}
    sha = pack(str(repo)).sha256
    assert init["command"][:4] == ["python3", "-m", "workload.sidecar", "install"]
    assert env[Env.CODE_SHA256] == sha and env[Env.STORAGE] == "gs://bucket/xr"
    main = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert main[Env.WORKDIR] == "/xrun/code"
    assert any(m["mountPath"] == "/xrun" for m in pod["containers"][0]["volumeMounts"])



def test_the_init_container_checks_the_digest(tmp_path):
    """xrun-init (python3 -m workload.sidecar install) unpacks only an archive whose sha256
    is the manifest's: a replaced or missing one fails it, one line, nothing unpacked."""
    import sys

    from cli_helpers import REPO

    repo = make_repo(tmp_path / "repo", {"a.py": "A = 1\n", "bin/run.sh": "echo\n"})
    (repo / "bin" / "run.sh").chmod(0o755)
    packed = pack(str(repo))
    store = open_storage(str(tmp_path / "store"))

    def install(sha: str) -> subprocess.CompletedProcess:
        pod = tmp_path / f"pod-{sha[:6]}"
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), Env.CODE_SHA256: sha,
               Env.STORAGE: str(tmp_path / "store"), Env.POD_DIR: str(pod)}
        return subprocess.run([sys.executable, "-m", "workload.sidecar", "install", str(pod)], env=env,
                              capture_output=True, text=True, timeout=60)

    assert code.upload(store, packed)
    ok = install(packed.sha256)
    assert ok.returncode == 0, ok.stderr
    dest = tmp_path / f"pod-{packed.sha256[:6]}" / "code"
    assert (dest / "a.py").read_text() == "A = 1\n" and os.access(dest / "bin" / "run.sh", os.X_OK)
    forged = "f" * 64  # an object under a name its bytes do not hash to
    store.write_bytes(Layout.code(forged), packed.data)
    bad = install(forged)
    assert (bad.returncode == 1 and "corrupt or replaced" in bad.stderr
            and not (tmp_path / "pod-ffffff" / "code").exists())
    missing = install("e" * 64)
    assert missing.returncode == 1 and "no archive" in missing.stderr and "Traceback" not in missing.stderr
