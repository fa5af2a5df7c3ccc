"""Hostile and mistaken input, every command: exit 2 (3 for storage), one line on stderr,
nothing on stdout, nothing written anywhere (the storage root, another root next to it and
$HOME are byte-for-byte unchanged), no traceback, bounded time and memory.

The CLI runs in-process (``orchestrator.cli.main``): a subprocess per case would cost a
second of imports each on a shared machine.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from xrun_contract import Layout

GOOD = ["--accelerator", "cpu-2", "--image", "img"]
TRAIN = "python3 -m workload.train"


def _make_run(root: Path, name: str) -> None:
    """A finished run as the supervisor leaves it (enough for every reader)."""
    run = root / Layout.run(name)
    (run / "checkpoints" / "10").mkdir(parents=True)
    (run / "checkpoints" / "10" / "data").write_bytes(b"x")
    (run / "run.json").write_text(json.dumps({"name": name, "backend": "local", "spec": {}}))
    (run / "state.json").write_text(json.dumps({"backend": "local", "state": "Succeeded",
                                                "restarts": 0, "hosts": {}, "transitions": []}))
    (run / "manifest.yaml").write_text("kind: JobSet\n")


# "Billion laughs": 9**8 strings from a few hundred bytes, under a key whose error quotes
# the value it got (max_restarts: "must be an integer, got <repr>").
_BOMB = b"max_restarts:\n  - &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + b"".join(
    b"  - &%s [%s]\n" % (n.encode(), b", ".join([b"*" + p.encode()] * 9))
    for p, n in zip("abcdefg", "bcdefgh", strict=True))


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A storage root with run 'done', another root with run 'x', input files, a fake $HOME."""
    store, other, inputs, home = (tmp_path / n for n in ("store", "other", "in", "home"))
    for d in (inputs, home):
        d.mkdir()
    _make_run(store, "done")
    _make_run(other, "x")
    files = {
        "nonutf8.yaml": b"name: caf\xe9\naccelerator: cpu-2\n",
        "deep.yaml": b"a: " + b"[" * 20000 + b"]" * 20000 + b"\n",
        "deepmap.yaml": b"a: " + b"{b: " * 20000 + b"1" + b"}" * 20000 + b"\n",
        "dup.yaml": b"name: a\nname: b\naccelerator: cpu-2\nimage: i\n",
        "list.yaml": b"- name: a\n",
        "unknown.yaml": b"name: a\naccelerator: cpu-2\nimage: i\nbogus: 1\n",
        "nonutf8.env": b"A=\xff\xfe\n",
        "bad.env": b"JUSTAKEY\n",
        "nightly-dup.yaml": (b"prefix: n\nbase: main\nbase: feat\nslice: {accelerator: cpu-2}\n"
                             b"branches: {main: {image: a}, feat: {image: b}}\n"
                             b"configs: {tiny: {command: 'python3 -m workload.train'}}\n"),
        "nightly-nonutf8.yaml": b"prefix: n\xff\n",
        "a-file-root": b"not a folder\n",
        "bomb.yaml": _BOMB + b"name: ok\naccelerator: cpu-2\nimage: i\n",
        "nightly-bomb.yaml": (b"prefix: n\nbase: main\nslice: {accelerator: cpu-2}\nstorage: s\n"
                              b"branches: {main: {image: a}, feat: {image: b}}\n"
                              b"configs: {tiny: {command: 'python3 -m workload.train'}}\nrun:\n  "
                              + _BOMB.replace(b"\n", b"\n  ").rstrip() + b"\n"),
        "big.yaml": b"name: ok\n# " + b"x" * (1 << 20) + b"\n",
        "big.env": b"A=" + b"x" * (1 << 20) + b"\n",
        "big-value.env": b"BIG=" + b"x" * 300_000 + b"\n",
    }
    for name, data in files.items():
        (inputs / name).write_bytes(data)
    (inputs / "a-dir").mkdir()
    # --workdir trees that would ship wrong: a .git file naming a gone repository (a removed
    # worktree's), a binary .xrunignore, a dangling symlink.
    for wd in ("wd-gitfile", "wd-binignore", "wd-dangling"):
        (inputs / wd).mkdir()
        (inputs / wd / "train.py").write_text("print('hi')\n")
    (inputs / "wd-gitfile" / ".git").write_text("gitdir: /nonexistent-xrun/repo.git/worktrees/wd\n")
    (inputs / "wd-binignore" / ".xrunignore").write_bytes(b"\x00\x01\xff\xfe*.pyc\x00")
    (inputs / "wd-dangling" / "data").symlink_to("not-there")
    os.mkfifo(inputs / "fifo.yaml")  # no writer: an open() without O_NONBLOCK blocks for ever
    for key in ("XRUN_STORAGE_TIMEOUT", "XRUN_STORAGE", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XRUN_STORAGE", str(store))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.chdir(inputs)
    return tmp_path


def _snapshot(base: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(base)): (p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(base.rglob("*"))}


def R(*args: str) -> list[str]:  # noqa: N802 - a render with good defaults
    return ["render", "--name", "ok", *GOOD, *args]


def S(*args: str) -> list[str]:  # noqa: N802 - a submit with good defaults
    return ["submit", "--name", "ok", *GOOD, *args]


CASES: list[tuple[str, list[str], int, str]] = [
    # render: spec fields
    ("render-bad-name", ["render", "--name", "Bad_Name", *GOOD], 2, "name:"),
    ("render-traversal-name", ["render", "--name", "../../etc", *GOOD], 2, "name:"),
    ("render-long-name", ["render", "--name", "a" * 70, *GOOD], 2, "name:"),
    ("render-unknown-accel", ["render", "--name", "ok", "--accelerator", "nope-9", "--image", "i"], 2, "accelerator"),
    ("render-num-slices-0", R("--num-slices", "0"), 2, "num_slices"),
    ("render-max-restarts-neg", R("--max-restarts", "-1"), 2, "max_restarts"),
    ("render-max-restarts-huge", R("--max-restarts", "1000000"), 2, "max_restarts"),
    ("render-grace-0", R("--termination-grace-seconds", "0"), 2, "termination_grace_seconds"),
    ("render-grace-huge", R("--termination-grace-seconds", "99999999"), 2, "termination_grace_seconds"),
    ("render-ttl-neg", R("--ttl-seconds-after-finished", "-5"), 2, "ttl_seconds_after_finished"),
    ("render-ttl-huge", R("--ttl-seconds-after-finished", "9999999999"), 2, "ttl_seconds_after_finished"),
    ("render-codes-huge-range", R("--restartable-exit-codes", "1-99999999"), 2, "restartable_exit_codes"),
    ("render-codes-zero", R("--restartable-exit-codes", "0"), 2, "restartable_exit_codes"),
    ("render-codes-text", R("--restartable-exit-codes", "abc"), 2, "restartable_exit_codes"),
    ("render-codes-reversed", R("--restartable-exit-codes", "200-100"), 2, "restartable_exit_codes"),
    ("render-env-bad-key", R("--env", "1BAD=x"), 2, "env"),
    ("render-env-no-eq", R("--env", "NOVALUE"), 2, "--env"),
    ("render-env-reserved", R("--env", "XRUN_RUN_NAME=x"), 2, "env"),
    ("render-empty-command", R("--command", " "), 2, "command"),
    # sizes the kernel (execve: E2BIG) and Kubernetes (etcd's 1.5 MiB request) refuse
    ("render-env-300k", R("--env", "BIG=" + "x" * 300_000), 2,
     "env: BIG: BIG=value is 300005 bytes; Linux's limit for one environment string (MAX_ARG_STRLEN) is 131072"),
    ("render-env-total", R(*[f"--env=V{i}={'x' * 120_000}" for i in range(18)]), 2,
     "(ARG_MAX) is 2097152 bytes"),
    ("render-command-200k", R("--command", "echo " + "x" * 200_000), 2, "command: one argument of container"),
    ("render-manifest-too-big", R(*[f"--env=V{i}={'x' * 100_000}" for i in range(14)],
                                  "--pod-annotations", "note=" + "y" * 200_000), 2,
     "accepts objects of at most 1572864 bytes"),
    ("render-unparsable-command", R("--command", "echo 'unterminated"), 2, "command"),
    ("render-storage-scheme", R("--storage", "ftp://host/x"), 2, "storage"),
    # render: files
    ("render-nonutf8-file", ["render", "-f", "nonutf8.yaml"], 2, "not UTF-8"),
    ("render-deep-yaml", ["render", "-f", "deep.yaml"], 2, "run file: deep.yaml is nested too deeply (over 100"),
    ("render-deep-map-yaml", ["render", "-f", "deepmap.yaml"], 2, "deepmap.yaml is nested too deeply (over 100"),
    ("render-dup-keys", ["render", "-f", "dup.yaml"], 2, "duplicate key"),
    ("render-not-mapping", ["render", "-f", "list.yaml"], 2, "mapping"),
    ("render-unknown-key", ["render", "-f", "unknown.yaml"], 2, "bogus"),
    ("render-missing-file", ["render", "-f", "missing.yaml"], 2, "missing.yaml"),
    ("render-yaml-bomb", ["render", "-f", "bomb.yaml"], 2, "bomb.yaml: YAML aliases are not allowed"),
    ("render-big-file", ["render", "-f", "big.yaml"], 2, "big.yaml is 1048588 bytes; at most 1048576"),
    ("render-big-env-file", R("--env-file", "big.env"), 2, "big.env is 1048579 bytes; at most 1048576"),
    ("render-fifo-file", ["render", "-f", "fifo.yaml"], 2, "fifo.yaml is a FIFO, not a regular file"),
    ("render-fifo-env-file", R("--env-file", "fifo.yaml"), 2, "fifo.yaml is a FIFO, not a regular file"),
    ("render-dev-zero", ["render", "-f", "/dev/zero"], 2, "/dev/zero is a character device, not a regular"),
    ("render-nonutf8-env-file", R("--env-file", "nonutf8.env"), 2, "not UTF-8"),
    ("render-bad-env-file", R("--env-file", "bad.env"), 2, "KEY=VALUE"),
    ("render-output-file-no-dir", R("--output-file", "/nonexistent-xrun/out.yaml"), 2, "--output-file"),
    ("render-output-file-is-dir", R("--output-file", "a-dir"), 2, "output-file"),
    ("render-output-format", R("-o", "xml"), 2, "xml"),
    # render: xrun's workload arguments
    ("render-preset-nope", R("--command", f"{TRAIN} --preset nope"), 2, "preset"),
    ("render-steps-neg", R("--command", f"{TRAIN} steps=-1"), 2, "steps"),
    ("render-global-batch-7", R("--command", f"{TRAIN} global_batch=7"), 2, "global_batch"),
    ("render-seq-len-0", R("--command", f"{TRAIN} seq_len=0"), 2, "seq_len"),
    ("render-unknown-config-key", R("--command", f"{TRAIN} bogus=1"), 2, "bogus"),
    ("render-unknown-train-flag", R("--command", f"{TRAIN} --nope"), 2, "--nope"),
    ("render-bad-dtype", R("--command", "python3 -u -m workload.train remat=maybe"), 2, "remat"),
    ("render-bad-int", R("--command", f"{TRAIN} steps=ten && echo done"), 2, "steps"),
    # submit: the same refusals, and nothing written
    ("submit-bad-name", ["submit", "--name", "Bad_Name", *GOOD], 2, "name:"),
    ("submit-env-300k", S("--env", "BIG=" + "x" * 300_000), 2, "env: BIG: BIG=value is 300005 bytes"),
    ("submit-env-file-300k", S("--env-file", "big-value.env"), 2, "env: BIG: BIG=value is 300005 bytes"),
    ("submit-steps-neg", S("--command", f"{TRAIN} steps=-1"), 2, "steps"),
    ("submit-preset-nope", S("--command", f"{TRAIN} --preset nope"), 2, "preset"),
    ("submit-nonutf8-file", ["submit", "-f", "nonutf8.yaml"], 2, "UTF-8"),
    ("submit-deep-yaml", ["submit", "-f", "deep.yaml"], 2, "run file: deep.yaml is nested too deeply (over 100"),
    ("submit-yaml-bomb", ["submit", "-f", "bomb.yaml"], 2, "YAML aliases are not allowed"),
    ("submit-fifo-file", ["submit", "-f", "fifo.yaml"], 2, "not a regular file"),
    ("submit-codes-huge-range", S("--restartable-exit-codes", "1-99999999"), 2, "restartable_exit_codes"),
    ("submit-max-restarts-huge", S("--max-restarts", "1000"), 2, "max_restarts"),
    ("submit-exists", ["submit", "--name", "done", *GOOD], 2, "already exists"),
    ("submit-storage-timeout-0", S("--storage-timeout", "0"), 2, "storage timeout"),
    ("submit-storage-timeout-text", S("--storage-timeout", "soon"), 2, "storage timeout"),
    ("submit-storage-file-root", S("--storage", "a-file-root"), 2, "storage"),
    ("submit-workdir-git-file-nowhere", S("--workdir", "wd-gitfile"), 2,
     "wd-gitfile/.git is not a usable git checkout (not a git repository"),
    ("submit-workdir-binary-xrunignore", S("--workdir", "wd-binignore"), 2,
     "wd-binignore/.xrunignore is not a text file of patterns"),
    ("submit-workdir-dangling-symlink", S("--workdir", "wd-dangling"), 2,
     "workdir: data is a dangling symlink (to 'not-there', which does not exist)"),
    ("render-workdir-dangling-symlink", R("--workdir", "wd-dangling"), 2, "data is a dangling symlink"),
    ("submit-resume-unknown", ["submit", "--resume", "nope"], 2, "no run named 'nope'"),
    ("submit-resume-bad-name", ["submit", "--resume", "../done"], 2, "not a run name"),
    ("submit-resume-with-replace", ["submit", "--resume", "done", "--replace"], 2,
     "--resume: not with --replace/--force"),
    ("submit-resume-no-spec", ["submit", "--resume", "done"], 2, "records no spec; it cannot be resumed"),
    ("submit-resume-other-name", ["submit", "--resume", "done", "--name", "other", *GOOD], 2,
     "--resume: the given spec (run file or --name) names 'other', not 'done'"),
    # gc
    ("gc-grace-nan", ["gc", "--grace", "nan"], 2, "--grace': must be a finite number of seconds, 0 or more; got 'nan'"),
    ("gc-grace-inf", ["gc", "--grace", "inf"], 2, "must be a finite number of seconds, 0 or more; got 'inf'"),
    ("gc-grace-negative", ["gc", "--grace", "-5"], 2, "must be a finite number of seconds, 0 or more; got '-5'"),
    ("gc-storage-missing", ["gc", "--storage", "/nonexistent-xrun/x"], 2,
     "--storage: /nonexistent-xrun/x does not exist (no runs or archives there)"),
    # status
    ("status-traversal", ["status", "../../other/runs/x"], 2, "not a run name"),
    ("status-slash", ["status", "a/b"], 2, "not a run name"),
    ("status-dotdot", ["status", ".."], 2, "not a run name"),
    ("status-uppercase", ["status", "Done"], 2, "not a run name"),
    ("status-unknown", ["status", "nope"], 2, "no run named"),
    ("status-format", ["status", "done", "-o", "xml"], 2, "xml"),
    ("status-timeout-neg", ["status", "done", "--storage-timeout", "-1"], 2, "storage timeout"),
    ("status-storage-scheme", ["status", "done", "--storage", "ftp://x/y"], 2, "storage"),
    ("status-gs-no-bucket", ["status", "done", "--storage", "gs://"], 2, "bucket"),
    # logs
    ("logs-traversal", ["logs", "../done"], 2, "not a run name"),
    ("logs-host", ["logs", "done", "--host", "abc"], 2, "--host"),
    ("logs-tail", ["logs", "done", "--tail", "-2"], 2, "--tail: must be >= 0, or -1 for all lines"),
    ("logs-since", ["logs", "done", "--since", "ten"], 2, "since"),
    ("logs-unknown", ["logs", "nope"], 2, "no run named"),
    # checkpoints
    ("checkpoints-traversal", ["checkpoints", "../../other/runs/x"], 2, "not a run name"),
    ("checkpoints-dot-segment", ["checkpoints", "done/.."], 2, "not a run name"),
    ("checkpoints-unknown", ["checkpoints", "nope"], 2, "no run named"),
    # delete
    ("delete-purge-traversal", ["delete", "--purge", "--yes", "../../other/runs/x"], 2, "not a run name"),
    ("delete-purge-abs", ["delete", "--purge", "--yes", "/tmp"], 2, "not a run name"),
    ("delete-traversal", ["delete", "../done"], 2, "not a run name"),
    ("delete-purge-unconfirmed", ["delete", "done", "--purge"], 2, "--yes"),
    ("delete-unknown", ["delete", "nope"], 2, "no run named"),
    # list
    ("list-file-root", ["list", "--storage", "a-file-root"], 2, "not a folder"),
    ("list-scheme", ["list", "--storage", "s3://b/x"], 2, "storage"),
    ("list-format", ["list", "-o", "xml"], 2, "xml"),
    ("list-timeout-text", ["list", "--storage-timeout", "x"], 2, "storage timeout"),
    # compare and report
    ("compare-traversal", ["compare", "done", "../x"], 2, ""),
    ("compare-bad-name", ["compare", "done", "Bad_Name"], 2, "not a run name"),
    ("compare-unknown", ["compare", "done", "nope"], 2, "no run named"),
    ("compare-output-no-dir", ["compare", "done", "done", "-o", "/nonexistent-xrun/c.md"], 2, "/nonexistent-xrun"),
    ("compare-threshold", ["compare", "done", "done", "--threshold", "abc"], 2, "threshold"),
    ("report-output-no-dir", ["report", "done", "done", "-o", "/nonexistent-xrun/r.html"], 2, "/nonexistent-xrun"),
    ("report-bad-name", ["report", "done", "a..b"], 2, ""),
    ("compare-dev-zero", ["compare", "/dev/zero", "x.log"], 2, "/dev/zero is a character device, not a regular"),
    ("compare-fifo", ["compare", "done", "fifo.yaml"], 2, "fifo.yaml is a FIFO, not a regular file"),
    ("compare-output-proc", ["compare", "done", "done", "-o", "/proc/xrun-c.md"], 2,
     "--output: cannot write /proc/xrun-c.md"),
    ("compare-output-parent-is-file", ["compare", "done", "done", "-o", "a-file-root/c.md"], 2,
     "--output: a-file-root is not a folder"),
    ("report-output-proc", ["report", "done", "-o", "/proc/xrun-r.html"], 2, "--output: cannot write /proc"),
    ("report-output-parent-is-file", ["report", "done", "-o", "a-file-root/r.html"], 2,
     "--output: a-file-root is not a folder"),
    # nightly
    ("nightly-nonutf8", ["nightly", "-f", "nightly-nonutf8.yaml", "--dry-run"], 2, "UTF-8"),
    ("nightly-dup-keys", ["nightly", "-f", "nightly-dup.yaml", "--dry-run"], 2, "duplicate key"),
    ("nightly-deep", ["nightly", "-f", "deep.yaml", "--dry-run"], 2, "nested too deeply (over 100"),
    ("nightly-missing", ["nightly", "-f", "missing.yaml", "--dry-run"], 2, "missing.yaml"),
    ("nightly-yaml-bomb", ["nightly", "-f", "nightly-bomb.yaml", "--dry-run"], 2, "YAML aliases are not allowed"),
    ("nightly-big-file", ["nightly", "-f", "big.yaml", "--dry-run"], 2, "at most 1048576"),
    ("nightly-fifo", ["nightly", "-f", "fifo.yaml", "--dry-run"], 2, "FIFO, not a regular file"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input(world, capsys, case):
    _, argv, code, needle = case
    before = _snapshot(world)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started, cpu = time.monotonic(), time.process_time()
    rc = main(argv)
    took, cpu = time.monotonic() - started, time.process_time() - cpu
    out, err = capsys.readouterr()
    assert rc == code, (argv, rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xrun: error: "), err
    assert "Traceback" not in err and out == ""
    assert needle in lines[0], lines[0]
    assert _snapshot(world) == before, "something was written"
    # Bounded: 10 s of this process's CPU (the suite's other workers load the machine, so
    # wall time says little), and no wait on anything (a minute of wall time at most).
    assert cpu < 10 and took < 60, (cpu, took)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 200, grown_mib


def test_table_is_big_enough():
    assert len(CASES) >= 60
    assert {c[1][0] for c in CASES} >= {"render", "submit", "status", "logs", "checkpoints",
                                         "delete", "list", "compare", "report", "nightly"}


def test_env_storage_timeout_is_checked(world, capsys, monkeypatch):
    monkeypatch.setenv("XRUN_STORAGE_TIMEOUT", "forever")
    before = _snapshot(world)
    assert main(["status", "done"]) == 2
    assert "XRUN_STORAGE_TIMEOUT" in capsys.readouterr().err
    assert _snapshot(world) == before


def _writable(folder: Path) -> bool:
    probe = folder / f".xrun-probe-{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except OSError:
        return False
    probe.unlink()
    return True


@pytest.mark.parametrize("command", ["compare", "report"])
def test_output_into_read_only_folder(world, capsys, command):
    """-o into a folder that takes no new file: exit 2, one line, no traceback, nothing
    written. Root ignores mode bits, so as root the folder is /sys (no file can be created
    there)."""
    ro = world / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    folder = ro if not _writable(ro) else Path("/sys")
    if _writable(folder):
        pytest.skip("no folder here refuses new files")
    target = str(folder / "out.html")
    argv = ["compare", "done", "done", "-o", target] if command == "compare" else ["report", "done", "-o", target]
    before = _snapshot(world)
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert err.strip().splitlines() == [f"xrun: error: --output: cannot write {target}: Permission denied"], err
    assert "Traceback" not in err and out == ""
    assert _snapshot(world) == before


def test_error_lines_quote_bounded_values():
    """A value quoted in an error is cut, however big (or shared: 9**9 leaves) it is."""
    from manifests.spec import build_spec
    from xrun_contract.errors import XrunError

    bomb: list = ["lol"] * 9
    for _ in range(8):
        bomb = [bomb] * 9
    base = {"name": "ok", "accelerator": "cpu-2", "image": "img", "storage": "/tmp/s"}
    for key, value in (("max_restarts", bomb), ("image", "a b" * 500_000), ("name", "X" * 1_000_000)):
        started = time.monotonic()
        with pytest.raises(XrunError) as e:
            build_spec({**base, key: value}, {})
        assert time.monotonic() - started < 2
        assert str(e.value).startswith(f"{key}: ") and len(str(e.value)) < 300, str(e.value)[:400]
