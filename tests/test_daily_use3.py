"""Daily use, round 3 (issue 52): the README's commands as a new user types them, and the
small habits of other tools. In-process CLI calls on synthetic stored runs, no JAX."""

from __future__ import annotations

import json
import re
import shlex

from cli_helpers import REPO, xrun_here
from synthetic_runs import RunShape, write_stored_run


def test_compare_of_a_nightlys_runs_names_the_storage_to_add(tmp_path, monkeypatch):
    """`xrun compare A B` in the folder the nightly ran in, with the default root: exit 2
    naming ./xrun-nightly; with that --storage the comparison runs."""
    monkeypatch.chdir(tmp_path)
    night = tmp_path / "xrun-nightly"
    write_stored_run(night, "nightly-main-20261206-030000-0", RunShape(seed=1))
    write_stored_run(night, "nightly-feat-20261206-030000-1", RunShape(seed=2), branch="feat")
    default = tmp_path / "home-root"
    args = ("nightly-main-20261206-030000-0", "nightly-feat-20261206-030000-1")
    r = xrun_here("compare", *args, storage=default)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"xrun: error: BASE: no run named {args[0]!r} under {default}; it is under "
                                "./xrun-nightly: add --storage ./xrun-nightly")
    r = xrun_here("status", args[0], storage=default)
    assert r.returncode == 2 and "it is under ./xrun-nightly: add --storage ./xrun-nightly" in r.stderr
    r = xrun_here("compare", *args, "--storage", "./xrun-nightly", storage=default)
    assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("Verdict: OK"), r.stderr


def test_the_first_command_again_names_both_ways_on(tmp_path, monkeypatch):
    """The README's first command a second time: one line with --replace and a free name."""
    root = tmp_path / "root"
    write_stored_run(root, "local-tiny", RunShape())
    write_stored_run(root, "local-tiny-2", RunShape())
    r = xrun_here("submit", "-f", str(REPO / "examples" / "local-tiny.yaml"), storage=root)
    assert r.returncode == 2
    assert r.stderr.strip() == (f"xrun: error: name: run 'local-tiny' already exists under {root} (Succeeded); "
                                "to run it again: --replace (removes the old run's data) or --name local-tiny-3")
    assert sorted(p.name for p in (root / "runs").iterdir()) == ["local-tiny", "local-tiny-2"]


def test_the_readmes_nightly_block_makes_its_repository_first():
    """The README's nightly block shows the command that makes the example's repository
    before the nightly that needs it (tests/test_nightly_git.py runs both as written)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Nightly comparisons", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [shlex.split(ln, comments=True) for ln in block.strip().splitlines()]
    make = lines.index(["bash", "examples/make-nightly-repo.sh", "nightly-repo"])
    assert make < lines.index(["xrun", "nightly", "-f", "examples/nightly-local.yaml"])
    spec = (REPO / "examples" / "nightly-local.yaml").read_text()
    assert re.search(r"^repo: \./nightly-repo\b", spec, re.M)


def test_a_missing_repo_says_where_it_was_looked_for_and_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    r = xrun_here("nightly", "-f", "examples/nightly-local.yaml", storage=tmp_path / "s")
    assert r.returncode == 2
    assert r.stderr.strip() == (f"xrun: error: repo: {tmp_path}/nightly-repo does not exist (a relative repo: is "
                                f"from the current folder, {tmp_path}; examples/nightly-local.yaml's is made by "
                                "'bash examples/make-nightly-repo.sh nightly-repo')")
    assert not (tmp_path / "xrun-nightly").exists()



def test_one_pair_cannot_show_a_large_slowdown_is_noise_and_a_narrower_spread_is_no_gain(tmp_path):
    """A candidate 53% slower whose steps the test cannot tell from the base's (noisy) ones,
    with a much narrower spread: INCONCLUSIVE (one run a side cannot show significance),
    never "OK (1 improved)"; the spread row says narrower, on every output."""
    root = tmp_path / "root"
    write_stored_run(root, "base", RunShape(steps=14, seconds=0.150, jitter=0.06, seed=0))
    write_stored_run(root, "cand", RunShape(steps=14, seconds=0.198, jitter=0.004, seed=100))
    r = xrun_here("compare", "base", "cand", "--threshold", "10%", storage=root)
    assert r.returncode == 0, r.stderr
    want = ("INCONCLUSIVE: Steady-state s/step (median) +53.4% (within noise, p=0.115, n=11/11 steps): one run a "
            "side cannot show this is significant; repeat the runs (with 4 or more a side, a nightly's repeats: 4, "
            "the test is on per-run values)")
    lines = r.stdout.splitlines()
    assert lines[0] == f"**Verdict:** {want}" and lines[-1] == f"Verdict: {want}"
    spread = next(ln for ln in lines if ln.startswith("| Step time spread (IQR) |"))
    assert "narrower (not a speed change) (p=0.002" in spread and "improved" not in spread, spread
    doc = json.loads(xrun_here("compare", "base", "cand", "--threshold", "10%", "--format", "json",
                               storage=root).stdout)
    assert doc["verdict"] == want and "improved" not in {r["verdict"] for r in doc["rows"]}
    assert {r["metric"]: r["verdict"] for r in doc["rows"]}["Step time spread (IQR)"] == "narrower"


def test_list_says_unknown_for_a_garbage_state_json_as_status_does(tmp_path):
    """The summary says Succeeded; state.json is garbage: both commands say Unknown, warning."""
    from xrun_contract import summary
    from xrun_contract.storage import open_storage

    root = tmp_path / "root"
    write_stored_run(root, "good", RunShape(seed=1))
    write_stored_run(root, "bad", RunShape(seed=2))
    storage = open_storage(str(root))
    for name in ("good", "bad"):
        summary.write_run(storage, name, {"name": name, "backend": "local", "submitted_at": 1.0})
        summary.write_state(storage, name, {"state": "Succeeded", "restarts": 0})
    (root / "runs" / "bad" / "state.json").write_text('{"state": "Succe')
    st = xrun_here("status", "bad", storage=root)
    ls = xrun_here("list", storage=root)
    warning = f"xrun: warning: run bad: {root}/runs/bad/state.json is corrupt (not valid JSON"
    assert "Unknown" in st.stdout and warning in st.stderr, st.stderr
    rows = {ln.split()[0]: ln.split()[1] for ln in ls.stdout.splitlines()[1:]}
    assert rows == {"good": "Succeeded", "bad": "Unknown"} and warning in ls.stderr, (ls.stdout, ls.stderr)


def test_every_help_screen_fits_80_columns_and_wait_says_what_n_is():
    from click.testing import CliRunner

    from orchestrator.cli import LAZY_COMMANDS, cli

    for columns in ("80", "200"):
        for name in [None, *sorted(set(cli.commands) | set(LAZY_COMMANDS))]:
            r = CliRunner().invoke(cli, [*([name] if name else []), "--help"], env={"COLUMNS": columns})
            assert r.exit_code == 0, r.output
            wide = [ln for ln in r.output.splitlines() if len(ln) > 80]
            assert not wide, (name, columns, wide)
    r = CliRunner().invoke(cli, ["wait", "--help"])
    assert re.search(r"-n, --namespace TEXT\s+Override the namespace", r.output), r.output


def test_wait_takes_a_duration_and_logs_tail_minus_one_is_every_line(tmp_path):
    root = tmp_path / "root"
    write_stored_run(root, "done", RunShape())
    for timeout in ("1h", "1h30m", "90s", "3600", "2.5"):
        r = xrun_here("wait", "done", "--timeout", timeout, storage=root)
        assert r.returncode == 0 and "done: Succeeded" in r.stderr, (timeout, r.stderr)
    r = xrun_here("wait", "done", "--timeout", "soon", storage=root)
    assert r.returncode == 2 and r.stderr.strip() == (
        "xrun: error: --timeout: 'soon' is not a duration; use seconds (3600) or 90s, 30m, 1h30m")
    log = root / "runs" / "done" / "logs" / "0-0" / "attempt-000"
    log.mkdir(parents=True)
    (log / "00000000-w1.log").write_text("".join(f"line {i}\n" for i in range(30)))
    every = xrun_here("logs", "done", "--no-prefix", storage=root)
    assert every.returncode == 0 and every.stdout.count("line ") == 30, every.stderr
    for flag in ("--tail", "--tail-per-host"):
        r = xrun_here("logs", "done", "--no-prefix", flag, "-1", storage=root)
        assert r.returncode == 0 and r.stdout == every.stdout, (flag, r.stderr)
    r = xrun_here("logs", "done", "--tail", "-2", storage=root)
    assert r.returncode == 2 and "--tail: must be >= 0, or -1 for all lines" in r.stderr


def test_unknown_run_file_nightly_and_workload_keys_get_did_you_mean(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("name: x\naccelerator: cpu-1\nimage: i\ncomand: python3 -m workload.train\n")
    r = xrun_here("render", "-f", str(run))
    assert r.returncode == 2 and "run file: unknown key 'comand' (did you mean 'command'?); allowed: " in r.stderr
    r = xrun_here("render", "--name", "x", "--accelerator", "cpu-1", "--image", "i",
                  "--command", "python3 -m workload.train stpes=3")
    assert r.returncode == 2 and "unknown key 'stpes' (did you mean 'steps'?); allowed: " in r.stderr, r.stderr
    night = tmp_path / "n.yaml"
    night.write_text("prefix: n\nbase: main\nbranches: {main: {image: a}, f: {image: b}}\n"
                     "configs: {c: {command: x}}\nslice: {accelerator: cpu-1}\nstorage: s\nthreshhold: 5%\n")
    r = xrun_here("nightly", "-f", str(night), "--dry-run")
    assert r.returncode == 2 and "unknown key 'threshhold' (did you mean 'threshold'?)" in r.stderr, r.stderr


def test_the_goodput_row_does_not_say_goodput_twice(tmp_path):
    root = tmp_path / "root"
    write_stored_run(root, "done", RunShape())
    r = xrun_here("status", "done", storage=root)
    row = next(ln for ln in r.stdout.splitlines() if ln.startswith("Goodput"))
    assert re.match(r"Goodput\s+\d+\.\d% of ", row), row


def test_logs_of_a_run_with_no_lines_says_so(tmp_path):
    root = tmp_path / "root"
    write_stored_run(root, "quiet", RunShape())
    r = xrun_here("logs", "quiet", storage=root)
    assert r.returncode == 0 and r.stdout == ""
    assert r.stderr.strip() == "xrun: run quiet (Succeeded) wrote no log lines"
    log = root / "runs" / "quiet" / "logs" / "0-0" / "attempt-000"
    log.mkdir(parents=True)
    (log / "00000000-w1.log").write_text("hello\n")
    r = xrun_here("logs", "quiet", "--grep", "nothing-like-this", storage=root)
    assert r.returncode == 0 and r.stderr.strip() == "xrun: run quiet (Succeeded): no log lines match the filters"


def test_logs_follow_says_how_the_run_ended_and_ctrl_c_that_it_goes_on(tmp_path, monkeypatch):
    root = tmp_path / "root"
    write_stored_run(root, "over", RunShape())
    log = root / "runs" / "over" / "logs" / "0-0" / "attempt-000"
    log.mkdir(parents=True)
    (log / "00000000-w1.log").write_text("hello\n")
    r = xrun_here("logs", "over", "-f", "--no-prefix", storage=root)
    assert r.returncode == 0 and "hello" in r.stdout
    assert r.stderr.strip().splitlines()[-1] == "xrun: run over ended: Succeeded", r.stderr

    from orchestrator.services import logs as logs_service

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt
        yield  # a generator, as the real one

    monkeypatch.setattr(logs_service, "stamped_log_lines", interrupted)
    r = xrun_here("logs", "over", "-f", storage=root)
    assert r.returncode == 130
    assert r.stderr.strip().splitlines()[-1] == ("xrun: stopped following over; the run itself is not "
                                                 "stopped ('xrun delete over' stops it)"), r.stderr


def test_compare_status_and_list_read_whole_at_80_and_132_columns(tmp_path):
    """From a real terminal (a PTY of 80 and 132 columns): no line longer than the
    terminal, nothing cut ('…'), every row's base, candidate and delta shown, the run labels
    named, and a wrapped note indented under its first line."""
    from pty_screens import screen

    from orchestrator.analysis.compare import compare
    from orchestrator.cli.screen import _delta
    from orchestrator.readers.loaders import load_run

    root = tmp_path / "root"
    base, cand = "nightly-main-20261206-030000-0", "nightly-feat-slow-20261206-030000-1"
    write_stored_run(root, base, RunShape(seed=1, commit="abcdef1234"), branch="main")
    write_stored_run(root, cand, RunShape(seed=2, seconds=0.2, commit="bcdef12345"), branch="feat-slow")
    c = compare(load_run(base, str(root)), load_run(cand, str(root)))
    for columns in (80, 132):
        rc, lines = screen("compare", base, cand, columns=columns, storage=root)
        assert rc == 1, lines
        text = "\n".join(lines)
        assert all(len(ln) <= columns for ln in lines), [ln for ln in lines if len(ln) > columns]
        assert "…" not in text, text
        flat = " ".join(text.split())
        assert c.base_label in flat and c.cand_label in flat
        for r in c.rows:
            assert " ".join(r.metric.split()) in flat or all(w in flat for w in r.metric.split()), r.metric
            for cell in (r.base, r.cand, _delta(r)):
                assert cell in flat, (columns, r.metric, cell)
        notes = [i for i, ln in enumerate(lines) if ln.startswith("note: ")]
        assert notes and lines[notes[0] + 1].startswith("      "), lines[notes[0]:notes[0] + 2]
        for args in (("status", base), ("list",)):
            rc, lines = screen(*args, columns=columns, storage=root)
            assert rc == 0 and all(len(ln) <= columns for ln in lines), lines
            assert "…" not in "\n".join(lines), lines


def test_the_pinned_line_is_drawn_when_it_changes_not_on_a_timer():
    import io
    import time

    from rich.console import Console

    from orchestrator.cli.progress import ProgressScreen

    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    view = {"name": "r", "state": "Running", "phase": "training", "step": 3, "total_steps": 40, "loss": 2.5,
            "tokens_per_s": 1000.0, "window_steps": 3, "latest_checkpoint": None, "restarts": 0}
    with ProgressScreen(console) as screen:
        assert screen.live is not None and not screen.live.auto_refresh  # no timer thread
        drawn = []
        real = screen.live.refresh
        screen.live.refresh = lambda: (drawn.append(1), real())  # type: ignore[method-assign]
        for _ in range(10):
            screen.update(dict(view))
        time.sleep(0.6)  # a timer would have drawn it again meanwhile
        assert len(drawn) == 1
        screen.update({**view, "step": 4})
        assert len(drawn) == 2


def test_a_piped_progress_line_is_as_of_the_host_lines_above_it(capsys):
    from orchestrator.cli.progress import ProgressScreen
    from xrun_contract import STEP_LINE

    screen = ProgressScreen(_pipe_console(), interval=10.0, tty=False)
    screen.line("0-0", 0, STEP_LINE.format(step=16, seconds=0.2, tflops=1.0, tokens=100.0, total_weights=8,
                                           loss=3.25))
    view = {"name": "r", "state": "Running", "phase": "training", "step": 26, "total_steps": 40, "loss": 2.9,
            "tokens_per_s": 1000.0, "window_steps": 20, "step_seconds": 0.5, "eta_seconds": 7.0,
            "latest_checkpoint": None, "restarts": 0}
    screen.update(view, force=True)
    err = capsys.readouterr().err.strip()
    assert "step 16/40 | loss 3.2500 |" in err and "ETA 12s" in err, err


def _pipe_console():
    """A console that is not a terminal."""
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), force_terminal=False)


def test_a_wrapped_summary_line_is_indented_under_its_own():
    from orchestrator.cli.screen import fold

    line = "  goodput 24.1% of 36s: startup 20s, compilation 4.0s, productive 8.7s, slow steps 0.3s, teardown 3.0s"
    out = fold(line, 60).splitlines()
    assert len(out) == 2 and all(len(x) <= 60 for x in out) and out[1].startswith("      productive")
    assert " ".join(x.strip() for x in out) == line.strip()
    assert fold(line, None) == line and fold("  short", 80) == "  short"


def test_a_long_error_folds_on_a_terminal_and_stays_one_line_piped(tmp_path):
    from pty_screens import screen

    run = tmp_path / "run.yaml"
    run.write_text("name: x\naccelerator: cpu-1\nimage: i\ncomand: python3 -m workload.train\n")
    rc, lines = screen("render", "-f", str(run), columns=80, storage=tmp_path / "s")
    lines = [ln for ln in lines if ln]
    assert rc == 2 and len(lines) > 3 and all(len(ln) <= 80 for ln in lines), lines
    assert lines[0].startswith("xrun: error: run file: unknown key 'comand'") and lines[1].startswith("    ")
    r = xrun_here("render", "-f", str(run))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_stored_lines_written_apart_carry_their_own_stamps(tmp_path):
    """#52: ``logs --timestamps`` showed one stamp for ~7 lines: the shipper read (and stamped)
    the output file every 0.2 s, so the lines of a fast loop shared a read's time. Lines
    written 0.15 s apart now carry their own times, each within a read of its write."""
    import threading
    import time as _time

    from workload import sidecar
    from xrun_contract import split_stamp

    out = tmp_path / "output.log"
    out.write_text("")
    chunks: list[bytes] = []
    stop = threading.Event()
    shipper = threading.Thread(target=sidecar.run, args=(tmp_path, lambda _seq, data: chunks.append(data), 0.3, stop))
    shipper.start()
    written = []
    try:
        with out.open("a") as f:
            for i in range(8):
                written.append(_time.time())
                f.write(f"line {i}\n")
                f.flush()
                _time.sleep(0.15)
    finally:
        stop.set()
        shipper.join(30)
    stored = [split_stamp(line) for line in b"".join(chunks).decode().splitlines()]
    assert [text for _t, text in stored] == [f"line {i}" for i in range(8)]
    stamps = [t for t, _text in stored]
    assert stamps == sorted(stamps)
    assert all(t is not None and t >= w - 0.01 for t, w in zip(stamps, written, strict=True))
    # Read every 0.2 s, 8 lines over 1.05 s got at most 6 stamps; allow one shared under load.
    assert len(set(stamps)) >= 7, stamps


def test_doctor_reads_whole_at_80_and_132_columns(tmp_path, monkeypatch):
    """#52: doctor printed each check on one line however long (176 columns here, a capacity
    error 400): on a terminal a detail now wraps under its own column; piped it stays one
    line for grep."""
    from pty_screens import screen

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    storage = tmp_path / "a-local-root-whose-path-makes-the-storage-line-long-enough-to-wrap"
    piped = xrun_here("doctor", "-o", "json", storage=storage, KUBECONFIG=str(tmp_path / "no-kubeconfig"))
    details = [" ".join(c["detail"].split()) for c in json.loads(piped.stdout)["checks"]]
    assert any(len(d) > 80 for d in details), details
    for columns in (80, 132):
        rc, lines = screen("doctor", columns=columns, storage=storage)
        assert rc == 3, lines
        lines = [ln for ln in lines if ln]
        assert all(len(ln) <= columns for ln in lines), [ln for ln in lines if len(ln) > columns]
        flat = "".join("".join(lines).split())
        assert all("".join(d.split()) in flat for d in details), (details, lines)
        heads = [ln for ln in lines if ln[:4] in ("PASS", "FAIL", "WARN", "skip")]
        rest = [ln for ln in lines if ln not in heads and not ln.startswith("xrun: doctor")]
        assert len(heads) == len(details) and all(ln.startswith(" " * 15) for ln in rest), lines
        if columns == 80:
            assert rest, lines  # something did wrap


def test_follow_and_logs_f_read_whole_at_80_and_132_columns(tmp_path):
    """#52: the walkthrough's follow from a real terminal: ``submit --follow`` of
    examples/local-tiny.yaml at 80 columns, then ``logs -f`` of that run at 132. Every
    pinned line drawn fits the terminal and labels each value, the last one shows step,
    loss, tokens/s and the checkpoint, the summary's lines (the "quiet:" one was 114
    columns) fit and wrap indented under their own, and no line of noise (Gloo's, or its
    torn tail) is shown."""
    from pty_screens import drawn, screen

    root = tmp_path / "root"
    raw: list[str] = []
    rc, _ = screen("submit", "-f", "examples/local-tiny.yaml", "--name", "walk", "--follow", columns=80,
                   storage=root, timeout=600, cwd=REPO, raw=raw)
    assert rc == 0, drawn(raw[0])[-40:]
    rc, _ = screen("logs", "walk", "-f", columns=132, storage=root, timeout=120, cwd=REPO, raw=raw)
    assert rc == 0, drawn(raw[1])[-40:]
    for columns, out in ((80, drawn(raw[0])), (132, drawn(raw[1]))):
        out = [p for p in out if p]
        pinned = [p for p in out if re.match(r"walk [a-z]+(?:  |$)", p)]
        assert pinned, out[-40:]
        assert all(len(p) <= columns and "…" not in p for p in pinned), [p for p in pinned if len(p) > columns]
        for p in pinned:  # no value without its label
            body = re.sub(r"^walk [a-z]+\s*(?:━+ \d+%)?", "", p)
            assert not re.search(r"(?:^|  )[\d,.]+(?:  |$)", body), p
        assert re.search(r"step 40/40  loss [\d.]+  (?:tok/s|tokens/s \(total, 20-step median\)) [\d,]+  "
                         r"(?:ETA \d+s  )?(?:ckpt|checkpoint) step 40", pinned[-1]), pinned[-1]
        shown = [p for p in out if p.startswith("[0-")]
        assert shown and all(re.match(r"\[0-[01]\] \S", p) and "Gloo" not in p for p in shown), shown
    out = [p for p in drawn(raw[0]) if p]
    summary = out[next(i for i, p in enumerate(out) if p.startswith("  steps 40/40")):]
    assert all(len(p) <= 80 and p.startswith("  ") for p in summary), summary
    assert any(p.startswith("  quiet: ") for p in summary) and summary[-1].startswith("      "), summary
    ended = [p for p in drawn(raw[1]) if p]
    assert ended[-1] == "xrun: run walk ended: Succeeded (all pods succeeded)", ended[-5:]


NIGHT_DRIVER = """
import sys
from pathlib import Path

sys.path.insert(0, {tests!r})
from synthetic_runs import RunShape, write_stored_run

from orchestrator.cli import main
from orchestrator.services import nightly as svc


def submit(run):  # the runs as stored, without JAX: feat's steps a third slower
    seconds = 0.2 if run.branch.name == "feat" else 0.15
    write_stored_run(Path({root!r}), run.name, RunShape(seed=run.index, seconds=seconds, loss_decay=0.0,
                                                       jitter=0.004), branch=run.branch.name)


svc.submit_run = submit
sys.exit(main(sys.argv[1:]))
"""


def test_the_nightly_reads_whole_at_80_and_132_columns(tmp_path):
    """#52: the nightly printed its markdown as written: notes of 414 columns, a headline of
    139. On a terminal its prose folds under its own line; table rows stay rows, the last
    line (the verdict CI reads) stays whole, and nothing of summary.md is lost. Synthetic
    runs (only the submission is replaced), from a PTY."""
    import sys

    from pty_screens import screen
    from synthetic_runs import write_nightly_file

    root = tmp_path / "store"
    driver = tmp_path / "driver.py"
    driver.write_text(NIGHT_DRIVER.format(tests=str(REPO / "tests"), root=str(root)))
    night = write_nightly_file(tmp_path / "nightly.yaml", root, repeats=2)
    for columns in (80, 132):
        rc, lines = screen("nightly", "-f", str(night), columns=columns, storage=root,
                           program=[sys.executable, str(driver)], timeout=120)
        assert rc == 1, lines[-20:]
        report = sorted((root / "reports").iterdir())[-1]
        md = (report / "summary.md").read_text().splitlines()
        shown = lines[next(i for i, ln in enumerate(lines) if ln.startswith("# xrun nightly")):]
        shown = shown[:next(i for i, ln in enumerate(shown) if ln.startswith("Verdict: ")) + 1]
        assert shown[-1] == md[-1]  # whole, and last
        prose = [ln for ln in shown[:-1] if not ln.startswith("|")]
        assert all(len(ln) <= columns for ln in prose), [ln for ln in prose if len(ln) > columns]
        assert "".join("".join(shown).split()) == "".join("".join(md).split())
        assert [ln for ln in shown if ln.startswith("|")] == [ln for ln in md if ln.startswith("|")]
