"""The terminal (#15): progress line, quiet logs, logs/list/wait/compare flags, wrapper JSON.

Most tests read runs written straight into a storage folder (no training); one test drives
a real local run in a pseudo-terminal and reads the screen.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import REPO, xrun, xrun_env
from synthetic_runs import RunShape, write_stored_run

from orchestrator.cli.progress import LineFilter, ProgressScreen, plain_progress, rich_progress
from orchestrator.cli.screen import age
from orchestrator.readers.logs import parse_duration, parse_since, parse_time
from orchestrator.readers.record import RunRecord
from orchestrator.services.view import phase
from xrun_contract import Layout, split_stamp, stamp_line
from xrun_contract.storage import open_storage

T0 = datetime.datetime(2026, 1, 2, 15, 0, 0, tzinfo=datetime.UTC).timestamp()


def rfc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------
# Pure parts


def test_durations_times_and_stamps():
    assert parse_duration("1h30m") == 5400 and parse_duration("90s") == 90
    assert parse_duration("2h15m30s") == 8130 and parse_duration("500ms") == 0.5
    assert parse_duration("1d") == 86400
    for bad in ("", "1x", "h1", "10", "1h 30m", "-5m"):
        with pytest.raises(ValueError, match="--since"):
            parse_duration(bad)
    assert parse_time("2026-01-02T15:00:00Z") == T0
    assert parse_time("2026-01-02T16:00:00.5+01:00") == T0 + 0.5
    with pytest.raises(ValueError, match="RFC3339"):
        parse_time("2026-01-02T15:00:00")  # no zone: refused, not guessed
    assert parse_since("10m", now=T0) == T0 - 600
    assert parse_since("2026-01-02T15:00:00Z", now=0) == T0
    line = stamp_line(T0 + 0.25, "hello world\n")
    assert line == "2026-01-02T15:00:00.250000Z hello world\n"
    assert split_stamp(line) == (T0 + 0.25, "hello world\n")
    assert split_stamp("no stamp here") == (None, "no stamp here")


def test_quiet_filter_drops_noise_and_repeated_headers():
    f = LineFilter()
    lines = [
        "[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1",
        "I1203 10:39:13.123456  1234 coordination_service.cc:123] started",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        'xrun-wrapper: start host=0-0 attempt=0 argv=["sh"]',
        "EXIT_CODE=0",
        "xrun header versions: jax=0.10.2",
        "xrun header config: preset=tiny",
        "completed step: 1, seconds: 0.1",
        "xrun header versions: jax=0.10.2",  # attempt 1 prints it again
        "xrun-wrapper: end host=0-0 exit_code=0 seconds=3.000",
        "W1206 22:30:01.123456 140123 multihost.py:437] [process=0][thread=MainThread] Reached "
        "preemption sync point, step=20",
        "WARNING:absl:[process=1][thread=save] Reached preemption sync point, step=20",
        "xrun-wrapper: end host=0-1 exit_code=3 seconds=3.000",
    ]
    assert [x for x in lines if f.keep(x)] == [
        "xrun header versions: jax=0.10.2", "xrun header config: preset=tiny",
        "completed step: 1, seconds: 0.1", "xrun-wrapper: end host=0-1 exit_code=3 seconds=3.000"]
    assert all(LineFilter(verbose=True).keep(x) for x in lines)


def test_a_host_whose_every_line_was_noise_is_named_at_the_end():
    """#39: in the README's run host 0-1 prints only noise, so quiet mode showed nothing of
    it and it looked absent; the end of the follow says what was hidden, and whose."""
    import io

    from rich.console import Console

    from orchestrator.cli.progress import ProgressScreen

    screen = ProgressScreen(Console(file=io.StringIO(), force_terminal=False), tty=False)
    for host, text in [("0-0", 'xrun-wrapper: start host=0-0 attempt=0 argv=["sh"]'),
                       ("0-0", "completed step: 1, seconds: 0.1"),
                       ("0-1", 'xrun-wrapper: start host=0-1 attempt=0 argv=["sh"]'),
                       ("0-1", "[Gloo] Rank 1 is connected to 1 peer ranks."),
                       ("0-1", "EXIT_CODE=0")]:
        screen.line(host, 0, text)
    assert screen.quiet_summary() == (
        "quiet: 4 lines of noise hidden; every line of host 0-1 (3) was noise "
        "(-v shows them; xrun logs NAME has them all)")
    loud = ProgressScreen(Console(file=io.StringIO(), force_terminal=False), tty=False, verbose=True)
    loud.line("0-1", 0, "EXIT_CODE=0")
    assert loud.quiet_summary() == ""


def _rec(**kw) -> RunRecord:
    rec = RunRecord(name="r", total_steps=100)
    for k, v in kw.items():
        setattr(rec, k, v)
    return rec


def test_phase_names_each_stage():
    running = [{"host": "0-0", "state": "Running"}]
    assert phase(_rec(), "Pending", 0, [{"host": "0-0", "state": "Pending"}], []) == "scheduling"
    assert phase(_rec(), "Running", 0, running, []) == "starting"
    ph = {"phase": "imports", "activity": "initializing distributed", "attempt": 0}
    assert phase(_rec(phase=ph), "Running", 0, running, []) == "initializing distributed"
    ph = {"phase": "checkpoint_manager", "activity": "restoring step 40", "step": 40, "attempt": 1}
    assert phase(_rec(phase=ph), "Running", 1, running, []) == "restoring step 40"
    # A phase of the previous attempt does not describe this one.
    assert phase(_rec(phase=ph), "Running", 2, running, []) == "starting"
    assert phase(_rec(phase={**ph, "activity": "compiling"}), "Running", 1, running, []) == "compiling"
    assert phase(_rec(phase={**ph, "activity": "training"}), "Running", 1, running, [4]) == "training"
    rec = _rec(phase={**ph, "activity": "training"})
    rec.steps.append(41, 0.2, 0.1, 100.0, 2.0, attempt=1)
    assert phase(rec, "Running", 1, running, []) == "training"
    assert phase(rec, "Running", 1, running, [41]) == "checkpointing"  # no step after the save
    assert phase(rec, "Running", 1, running, [40]) == "training"  # written under step 41
    assert phase(rec, "Restarting", 2, running, []) == "restarting attempt 2"
    assert phase(rec, "Succeeded", 1, running, []) == "succeeded"


def test_progress_line_figures_and_plain_cadence(capsys):
    view = {"name": "r", "state": "Running", "phase": "training", "step": 40, "total_steps": 100,
            "loss": 0.0001234, "tokens_per_s": 0.5, "eta_seconds": 75.0, "restarts": 1,
            "latest_checkpoint": {"step": 30}}
    line = plain_progress(view)
    assert line == ("xrun: r training | step 40/100 | loss 0.00012340 | tokens/s (total, 20-step median) 0.500 | "
                    "ETA 1m15s | checkpoint step 30 | restarts 1")
    assert "0.000 " not in line
    rich = rich_progress(view).plain
    assert "40%" in rich and "━" in rich and "tokens/s (total, 20-step median) 0.500" in rich
    from rich.console import Console

    screen = ProgressScreen(Console(file=open(os.devnull, "w")), interval=3600)  # noqa: SIM115
    assert not screen.tty
    with screen:
        screen.update(view)
        screen.update(view)  # same phase, within the interval: nothing
        screen.update({**view, "phase": "checkpointing"})
        screen.update(view, force=True)
    err = capsys.readouterr().err.splitlines()
    assert [ln.split(" | ")[0] for ln in err] == ["xrun: r training", "xrun: r checkpointing", "xrun: r training"]


def test_age_like_kubectl():
    now = 1_000_000.0
    assert [age(now - s, now) for s in (5, 119, 150, 900, 3 * 3600 + 600, 30 * 3600, 3 * 86400 + 7200, 30 * 86400)] == [
        "5s", "119s", "2m30s", "15m", "3h10m", "30h", "3d2h", "30d"]


# ---------------------------------------------------------------------------------------
# logs flags on a stored run: two hosts, stamped lines and one unstamped (older) chunk


@pytest.fixture()
def logged_run(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    write_stored_run(root, "lg", RunShape(steps=20))
    now = time.time()
    chunks = {
        ("0-0", 0): [(now - 7200, "old a"), (now - 60, "new a1 loss 3"), (now - 30, "new a2")],
        ("0-1", 0): [(now - 7200, "old b"), (now - 50, "new b1 loss 4"), (now - 20, "new b2")],
    }
    for (host, attempt), lines in chunks.items():
        d = root / Layout.host_logs("lg", host, attempt)
        d.mkdir(parents=True)
        (d / "00000000.log").write_text("".join(stamp_line(t, x + "\n") for t, x in lines))
        os.utime(d / "00000000.log", (now - 10, now - 10))
    legacy = root / Layout.host_logs("lg", "0-0", 1)  # written before lines were stamped
    legacy.mkdir(parents=True)
    (legacy / "00000000.log").write_text("legacy 1\nlegacy 2\n")
    os.utime(legacy / "00000000.log", (now - 5, now - 5))
    return root


def test_logs_tail_is_total_and_per_host(logged_run: Path):
    out = lambda *a: xrun("logs", "lg", *a, storage=logged_run)  # noqa: E731
    r = out("--tail", "3", "--no-prefix")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["new b2", "legacy 1", "legacy 2"]
    r = out("--tail-per-host", "1")
    assert r.stdout.splitlines() == ["[0-1] new b2", "[0-0 #1] legacy 2"]
    r = out("--tail", "0")
    assert r.stdout == ""
    assert out("--tail-per-host", "-2").returncode == 2  # -1 is every line, as kubectl's --tail


def test_logs_since_filters_per_line(logged_run: Path):
    r = xrun("logs", "lg", "--since", "1h30m", "--no-prefix", storage=logged_run)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "old a" not in lines and "old b" not in lines  # same chunk as newer lines
    assert {"new a1 loss 3", "new a2", "new b1 loss 4", "new b2", "legacy 1"} <= set(lines)
    since = rfc(time.time() - 40)
    r = xrun("logs", "lg", "--since-time", since, "--no-prefix", storage=logged_run)
    assert set(r.stdout.splitlines()) == {"new a2", "new b2", "legacy 1", "legacy 2"}
    r = xrun("logs", "lg", "--since", since, "--no-prefix", storage=logged_run)
    assert set(r.stdout.splitlines()) == {"new a2", "new b2", "legacy 1", "legacy 2"}
    for bad in (["--since", "1h30"], ["--since-time", "yesterday"], ["--since", "1m", "--since-time", since]):
        r = xrun("logs", "lg", *bad, storage=logged_run)
        assert r.returncode == 2 and r.stderr.startswith("xrun: error: --since"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1


def test_logs_grep_timestamps_and_unknown_host(logged_run: Path):
    r = xrun("logs", "lg", "--grep", r"loss \d", "--timestamps", storage=logged_run)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split(" ", 1)[1] for ln in lines] == ["[0-0] new a1 loss 3", "[0-1] new b1 loss 4"]
    t, _ = split_stamp(lines[0])
    assert t is not None and abs(t - (time.time() - 60)) < 30
    r = xrun("logs", "lg", "--grep", "(", storage=logged_run)
    assert r.returncode == 2 and "--grep" in r.stderr
    r = xrun("logs", "lg", "--host", "9-9", storage=logged_run)
    assert r.returncode == 2 and r.stdout == ""
    assert "9-9" in r.stderr and "hosts: 0-0, 0-1" in r.stderr
    r = xrun("logs", "lg", "--host", "0-1", "--no-prefix", "--tail", "1", storage=logged_run)
    assert r.stdout.splitlines() == ["new b2"]


def test_logs_colours_per_host_on_request(logged_run: Path):
    r = xrun("logs", "lg", "--color", "always", "--tail-per-host", "1", storage=logged_run)
    assert r.returncode == 0, r.stderr
    a, b = r.stdout.splitlines()
    colour = re.compile(r"\x1b\[([0-9;]+)m\[")
    assert colour.match(a) and colour.match(b) and colour.match(a)[1] != colour.match(b)[1]
    assert "\x1b[" not in xrun("logs", "lg", storage=logged_run).stdout  # piped: plain


# ---------------------------------------------------------------------------------------
# list, status, wait on stored runs


def test_list_status_checkpoint_times(tmp_path: Path):
    root = tmp_path / "store"
    write_stored_run(root, "done", RunShape(steps=20), submitted_at=time.time() - 3 * 3600 - 600)
    r = xrun("list", storage=root)
    assert r.returncode == 0, r.stderr
    head, row = r.stdout.splitlines()
    assert head.split() == ["NAME", "STATE", "STEP", "LOSS", "AGE"]
    name, state, step, loss, age_ = row.split()
    total = RunShape(steps=20).config["steps"]  # what the run was asked for
    assert (name, state, step, age_) == ("done", "Succeeded", f"20/{total}", "3h10m")
    assert loss != "-" and "0.000" not in loss
    r = xrun("list", "-o", "wide", storage=root)
    assert r.stdout.splitlines()[0].split() == ["NAME", "STATE", "STEP", "LOSS", "AGE", "RESTARTS",
                                                "BACKEND", "ACCELERATOR", "SUBMITTED"]
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r.stdout)
    (item,) = json.loads(xrun("list", "-o", "json", storage=root).stdout)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", item["submitted_at"])
    assert (item["step"], item["total_steps"]) == (20, total)
    view = json.loads(xrun("status", "done", "-o", "json", storage=root).stdout)
    assert view["eta_seconds"] is None and view["phase"] == "succeeded"
    assert all(isinstance(t["time"], str) and t["time"].endswith("Z") for t in view["transitions"])
    r = xrun("status", "done", storage=root)
    assert "ETA" not in r.stdout and "0.000" not in r.stdout


def test_status_gives_each_host_reason(tmp_path: Path):
    root = tmp_path / "store"
    write_stored_run(root, "bad", RunShape(steps=5), state="Failed")
    state = json.loads((root / "runs/bad/state.json").read_text())
    state["hosts"] = {"0-0": {"state": "Failed", "exit_code": 137}, "0-1": {"state": "Succeeded", "exit_code": 0}}
    (root / "runs/bad/state.json").write_text(json.dumps(state))
    view = json.loads(xrun("status", "bad", "-o", "json", storage=root).stdout)
    assert [(h["host"], h["reason"]) for h in view["hosts"]] == [
        ("0-0", "Error: exit code 137 (SIGKILL)"), ("0-1", "Completed")]


def test_wait_exit_codes(tmp_path: Path):
    root = tmp_path / "store"
    write_stored_run(root, "ok", RunShape(steps=5))
    write_stored_run(root, "ko", RunShape(steps=5), state="Failed")
    assert xrun("wait", "ok", storage=root).returncode == 0
    assert xrun("wait", "ko", storage=root).returncode == 125
    r = xrun("wait", "nope", storage=root)
    assert r.returncode == 2 and "nope" in r.stderr
    # A live run that does not end in time: 124, within the timeout.
    r = xrun("submit", "--name", "slow", "--accelerator", "cpu-1", "--image", "local",
             "--command", "sleep 30", "--detach", storage=root)
    assert r.returncode == 0, r.stderr
    try:
        t = time.monotonic()
        r = xrun("wait", "slow", "--timeout", "2", storage=root)
        assert r.returncode == 124 and time.monotonic() - t < 15, r.stderr
    finally:
        xrun("delete", "slow", storage=root)
    assert xrun("wait", "slow", "--timeout", "20", storage=root).returncode == 125  # deleted


# ---------------------------------------------------------------------------------------
# compare on a terminal


def test_compare_table_verdict_first_and_colours(tmp_path: Path):
    from rich.console import Console

    from orchestrator.analysis.compare import compare
    from orchestrator.cli.screen import comparison_screen
    from orchestrator.readers.loaders import load_run

    root = tmp_path / "store"
    write_stored_run(root, "base", RunShape(steps=60, seed=1))
    write_stored_run(root, "slow", RunShape(steps=60, seed=2, seconds=0.150 * 1.2), branch="feat")
    r = xrun("compare", "base", "slow", storage=root)  # not a terminal: Markdown
    assert r.returncode == 1 and r.stdout.startswith("**Verdict:** REGRESSED beyond 5%: ")
    assert r.stdout.splitlines()[-1].startswith("Verdict: REGRESSED beyond 5%: ")
    r = xrun("compare", "base", "slow", "--format", "table", storage=root)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith("REGRESSED beyond 5%: ")
    steady = "Steady-state s/step (median)"
    assert lines[0].startswith(f"REGRESSED beyond 5%: {steady} +"), lines[0]
    header = next(ln for ln in lines if ln.startswith("METRIC"))
    assert header.split() == ["METRIC", "main", "feat", "DELTA", "VERDICT"]
    rows = {ln.split("  ")[0]: ln for ln in lines[lines.index(header) + 1:] if ln and not ln.startswith("note")}
    end = header.index("DELTA") + len("DELTA")
    assert rows["Tok/s"][:end].endswith("%") and rows[steady][:end].endswith("%")  # aligned
    assert rows[steady][end:].split()[:2] == ["regressed", "p<0.001,"]
    assert "|" not in "".join(lines) and "**" not in "".join(lines)
    c = compare(load_run("base", str(root)), load_run("slow", str(root)))
    con = Console(force_terminal=True, color_system="standard", width=200, record=True,
                  file=open(os.devnull, "w"))  # noqa: SIM115
    con.print(comparison_screen(c))
    ansi = con.export_text(styles=True)
    assert "\x1b[1;31mREGRESSED" in ansi and "\x1b[31m" in ansi  # regressed cells red


# ---------------------------------------------------------------------------------------
# The wrapper's own lines as JSON (Cloud Logging), storage copy stamped and plain


def test_launcher_json_lines_and_stamped_storage(tmp_path: Path):
    """The pod launcher's own lines as JSON on the container's stdout (Cloud Logging), the
    program's lines untouched; the log shipper's storage copy stamped and plain."""
    import threading

    from test_manifests import run_launcher

    from workload.sidecar import run as ship

    root = tmp_path / "store"
    env = {"XRUN_LOG_FORMAT": "json", "XRUN_SLICE_INDEX": "0", "XRUN_HOST_INDEX": "1"}
    p, pod_dir = run_launcher(tmp_path, "echo hi; exit 3", env, stdout=subprocess.PIPE, text=True)
    stdout, _ = p.communicate(timeout=60)
    assert p.returncode == 3
    out = stdout.splitlines()
    assert "hi" in out  # the program's own line is untouched
    own = [json.loads(ln) for ln in out if ln.startswith("{")]
    assert [o["severity"] for o in own] == ["INFO", "ERROR", "ERROR"]
    assert own[0]["message"].startswith("xrun-wrapper: start host=0-1")
    assert own[-1]["message"] == "EXIT_CODE=3" and own[-1]["host"] == "0-1"
    storage = open_storage(str(root))
    stop = threading.Event()
    stop.set()

    def write(seq: int, data: bytes) -> None:
        storage.write_bytes(Layout.log_chunk("w", "0-1", 0, seq), data)

    ship(pod_dir, write, 0.1, stop)
    stored = (root / Layout.host_logs("w", "0-1", 0)).glob("*.log")
    text = "".join(f.read_text() for f in sorted(stored))
    lines = [split_stamp(ln) for ln in text.splitlines()]
    assert all(t is not None for t, _ in lines)
    assert [x for _, x in lines][1:] == ["hi", "xrun-wrapper: end host=0-1 exit_code=3 seconds="
                                         + lines[2][1].rsplit("=", 1)[1], "EXIT_CODE=3"]
    (tmp_path / "plain").mkdir()
    p, _ = run_launcher(tmp_path / "plain", "true", stdout=subprocess.PIPE, text=True)
    assert p.communicate(timeout=60)[0].splitlines()[-1] == "EXIT_CODE=0"  # plain by default


# ---------------------------------------------------------------------------------------
# One real local run in a pseudo-terminal: the progress line goes through the phases


def test_follow_in_a_terminal_shows_phases_once_header_no_zero_figures(tmp_path: Path):
    import pty
    import select

    store = tmp_path / "store"
    env = {**xrun_env(store), "COLUMNS": "200"}

    def in_pty(*args: str) -> tuple[subprocess.Popen, int]:
        master, slave = pty.openpty()
        p = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], stdin=slave,
                             stdout=slave, stderr=slave, env=env, close_fds=True, cwd=REPO)
        os.close(slave)
        return p, master

    p, master = in_pty("submit", "-f", str(REPO / "examples/local-tiny.yaml"), "--name", "pt",
                       "--command", "python3 -m workload.train --preset tiny steps=16 checkpoint_every=4",
                       "--env", "XRUN_TEST_FAIL_AT_STEP=6:42",
                       # Steps slow enough that both attempts train for seconds: the pinned
                       # line samples the stored records (flushed every ~2 s) once a second,
                       # and a warm start's 12 tiny steps pass in well under one.
                       "--env", "XRUN_TEST_STEP_DELAY=0.3", "--follow")
    deadline = time.time() + 240
    while time.time() < deadline and not (store / Layout.run_json("pt")).exists():
        time.sleep(0.2)
    q, qmaster = in_pty("logs", "pt", "-f")  # a second terminal follows the same run
    out = {master: b"", qmaster: b""}
    open_fds = [master, qmaster]
    status_phases: list[str] = []
    next_status = time.time()
    while open_fds and time.time() < deadline:
        ready, _, _ = select.select(open_fds, [], [], 0.5)
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                open_fds.remove(fd)
            out[fd] += chunk
        if p.poll() is None and time.time() >= next_status and len(status_phases) < 6:
            next_status = time.time() + 4  # `xrun status` shows the phase while it starts
            r = xrun("status", "pt", "-o", "json", storage=store)
            if r.returncode == 0:
                status_phases.append(json.loads(r.stdout)["phase"])
    rc, qrc = p.wait(timeout=30), q.wait(timeout=30)
    os.close(master)
    os.close(qmaster)

    def plain(b: bytes) -> str:
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b.decode("utf-8", "replace"))

    screen, logs_screen = plain(out[master]), plain(out[qmaster])
    assert rc == 0, screen[-3000:]
    assert qrc == 0, logs_screen[-3000:]
    assert status_phases and set(status_phases) - {"scheduling", "succeeded"}, status_phases
    # logs -f: host lines and the same progress line, quiet too.
    assert "[0-0 #1] completed step: 16" in logs_screen and "pt training" in logs_screen, logs_screen[-2000:]
    assert "xrun-wrapper: start" not in logs_screen and "0.000 " not in logs_screen
    # The pinned line went through the phases (each seen at least once).
    # (The Restarting state of a local run lasts less than a refresh: the restart shows as
    # attempt 1's startup phases with "restarts 1"; "restarting attempt K" is unit-tested.)
    startup = r"(starting|initializing distributed|opening checkpoints|initializing state|compiling|restoring step \d+)"
    assert "pt training" in screen, screen[-3000:]
    assert re.search(rf"pt {startup}  for \d+s  checkpoint none", screen), screen[-3000:]  # attempt 0
    assert re.search(rf"pt {startup} .*restarts 1", screen), screen[-3000:]  # attempt 1
    assert re.search(r"pt training .*checkpoint step \d+", screen)
    assert re.search(r"step \d+/16", screen) and "tokens/s (total)" in screen
    # Host lines above it, quiet: the header once per run (attempt 1 prints it again),
    # no wrapper start lines, no 0.000 figures, one end state.
    assert screen.count("xrun header versions:") == 1, screen
    assert "xrun-wrapper: start" not in screen and "EXIT_CODE=" not in screen
    assert "0.000 " not in screen and "0.00 split" not in screen
    assert screen.count("run pt: Succeeded") == 1 and "pt Succeeded" not in screen
    # Storage kept every line (both headers), stamped.
    r = xrun("logs", "pt", "--host", "0-0", "--grep", "xrun header versions", storage=store)
    assert len(r.stdout.splitlines()) == 2


def test_nightly_shows_which_run_is_at_which_phase(tmp_path: Path):
    """Each planned run's phase as it goes, numbered in the plan (no training: 'sleep')."""
    import yaml

    nightly = {"prefix": "nt", "slice": {"accelerator": "cpu-1"}, "base": "main",
               "branches": {"main": {"image": "img:main", "commit": "aaaa111"},
                            "feat": {"image": "img:feat", "commit": "bbbb222"}},
               "configs": {"quick": {"command": "sleep 2"}}, "storage": str(tmp_path / "store")}
    (tmp_path / "n.yaml").write_text(yaml.safe_dump(nightly))
    r = xrun("nightly", "-f", str(tmp_path / "n.yaml"), storage=tmp_path / "store", timeout=120)
    # 'sleep' trains nothing: the nightly says so (INCOMPLETE, exit 1) rather than "no regression".
    assert r.returncode == 1 and "no step recorded" in r.stdout, r.stderr
    shown = [ln for ln in r.stderr.splitlines() if " | " in ln]
    first = [ln.split(" | ")[0].split()[-1] for ln in shown if "[1/2] nt-main-" in ln]
    second = [ln.split(" | ")[0].split()[-1] for ln in shown if "[2/2] nt-feat-" in ln]
    for phases in (first, second):
        assert phases[0] in ("scheduling", "starting") and "succeeded" not in phases[:-1], shown
    assert r.stderr.index("[2/2] nt-feat-") > r.stderr.index("[1/2] nt-main-")


def test_gloos_torn_tail_is_not_a_stray_line():
    """#52: a stray "[0-1] 3" on a terminal. Gloo's two threads on host 0-1 print their
    connection line at once, interleaved into one line, and what is left of it comes next as
    a line of its own: a bare number or nothing (as a real local-tiny run stored it)."""
    f = LineFilter()
    stored = [
        ("0-1", "[Gloo] Rank [Gloo] Rank 32 is connected to  is connected to 33 peer ranks.  peer ranks. "
                "Expected number of connected peer ranks is : Expected number of connected peer ranks is : 3"),
        ("0-0", "completed step: 1, seconds: 0.1"),
        ("0-1", "3"),
        ("0-1", "[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1"),
        ("0-1", ""),
        ("0-1", "42"),  # the program's own line, after the tail: shown
        ("0-0", "7"),
    ]
    assert [(h, x) for h, x in stored if f.keep(x, h)] == [
        ("0-0", "completed step: 1, seconds: 0.1"), ("0-1", "42"), ("0-0", "7")]
