"""CLI conventions: --dry-run writes nothing, --help has examples, unknown runs exit 2."""

from __future__ import annotations

import yaml
from cli_helpers import xrun
from manifest_schemas import validate_jobset


def test_dry_run_prints_manifest_and_writes_nothing(tmp_path):
    store = tmp_path / "store"
    r = xrun("submit", "--name", "dry", "--tpu", "v6e-16", "--image", "img", "--dry-run", storage=store)
    assert r.returncode == 0, r.stderr
    validate_jobset(yaml.safe_load(r.stdout))
    assert not store.exists()


def test_bad_submit_writes_nothing(tmp_path):
    store = tmp_path / "store"
    r = xrun("submit", "--name", "Bad_Name", "--accelerator", "cpu-2", "--image", "i", storage=store)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert not store.exists()


def test_help_has_examples():
    for cmd in ("render", "submit", "status", "logs", "checkpoints", "list", "delete"):
        r = xrun(cmd, "--help", storage="/nonexistent")
        assert r.returncode == 0 and "Examples:" in r.stdout, cmd


def test_unknown_run_is_bad_input(tmp_path):
    for cmd in (["status", "nope"], ["logs", "nope"], ["checkpoints", "nope"], ["delete", "nope"]):
        r = xrun(*cmd, storage=tmp_path)
        assert r.returncode == 2 and "no run named 'nope'" in r.stderr, cmd
    r = xrun("logs", "nope", "--since", "ten", storage=tmp_path)
    assert r.returncode == 2 and "--since" in r.stderr


def test_lazily_loaded_commands_are_the_modules_commands():
    """`xrun status` does not import the analysis and doctor commands' modules; the names it
    loads them by are theirs, and `xrun --help` lists them all."""
    import importlib

    from click.testing import CliRunner

    from orchestrator.cli import LAZY_COMMANDS, cli

    for module in set(LAZY_COMMANDS.values()):
        names = {c.name for c in importlib.import_module(module).COMMANDS}
        assert names == {n for n, m in LAZY_COMMANDS.items() if m == module}, module
    r = CliRunner().invoke(cli, ["--help"])
    assert r.exit_code == 0, r.output
    listed = {line.split()[0] for line in r.output.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == set(cli.commands) | set(LAZY_COMMANDS) and "compare" in listed, listed
    r = CliRunner().invoke(cli, ["compare", "--help"])
    assert r.exit_code == 0 and "Examples:" in r.output, r.output


def test_collector_paused_nests_and_spans_threads():
    """The collector is off while any paused block runs (the status command's, the kube
    thread's decode inside it), on again after the last, and left off if it was off."""
    import gc
    import threading

    from orchestrator.collector import collector_paused

    assert gc.isenabled()
    inner_done, outer_may_end = threading.Event(), threading.Event()
    seen: list[bool] = []

    def other_thread() -> None:
        with collector_paused():
            seen.append(gc.isenabled())
            inner_done.set()
            outer_may_end.wait(5)
        seen.append(gc.isenabled())  # the main thread's block still runs

    with collector_paused():
        t = threading.Thread(target=other_thread)
        t.start()
        assert inner_done.wait(5)
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the other thread's block still runs
        outer_may_end.set()
        t.join(5)
    assert seen == [False, False]
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # not turned on by a block that found it off
    finally:
        gc.enable()


def test_status_imports_only_what_it_needs(tmp_path):
    """`xrun status` of a run in a folder imports neither storage nor cluster clients nor the
    manifest code (render and submit's): a tenth of a second and more of its start; a
    cluster run's status imports the kube backend, and google-cloud-storage only for gs://."""
    import json
    import subprocess
    import sys

    from cli_helpers import xrun_env
    from synthetic_runs import RunShape, write_stored_run

    root = tmp_path / "root"
    write_stored_run(root, "r1", RunShape())
    probe = ("import json, sys\nfrom orchestrator.cli import main\nrc = main(['status', 'r1'])\n"
             "print(json.dumps([rc, sorted(sys.modules)]), file=sys.stderr)\n")
    r = subprocess.run([sys.executable, "-c", probe], env=xrun_env(root), capture_output=True, text=True, timeout=120)
    rc, modules = json.loads(r.stderr.strip().splitlines()[-1])
    assert rc == 0 and "r1" in r.stdout, r.stderr
    loaded = {m for m in modules if m.split(".")[0] in ("google", "kubernetes", "manifests", "msgspec")}
    assert loaded == set(), sorted(loaded)
    assert "orchestrator.runfile" not in modules and "orchestrator.services.podcode" not in modules


def test_the_status_hosts_render_as_rich_renders_their_text():
    """The hosts of the status screen, rendered without rich's split-and-join of a Text
    that is not wrapped, are the very bytes the Text itself renders to, in colour or not,
    wrapped or not (the live follow screen wraps)."""
    import io

    from rich.console import Console, Group

    from orchestrator.cli import screen

    reasons = ["", "Unschedulable: 0/1024 nodes are available: " + "x " * 60, "ErrImagePull: 拉取失败", "OOMKilled"]
    states = ["Running", "Pending", "Failed", "Succeeded", "Terminating", "Weird"]
    hosts = [{"host": f"{i // 8}-{i % 8}", "state": states[i % len(states)], "attempt": i % 3 or None,
              "exit_code": (None, 0, 42)[i % 3], "pod": f"r-slice-{i // 8}-{i % 8}-abcde",
              "reason": reasons[i % len(reasons)]} for i in range(64)]
    view = {"name": "r", "backend": "kube", "accelerator": "v6e-256", "state": "Running", "restarts": 0,
            "message": "", "phase": None, "step": 10, "total_steps": 100, "loss": 1.0, "tokens_per_s": 100.0,
            "step_seconds": 0.5, "eta_seconds": 10, "window_steps": 20, "latest_checkpoint": None,
            "checkpoints_in_progress": [], "goodput": None, "storage": "gs://b/x", "hosts": hosts}
    new = screen.render_table(view)
    old = Group(*new.renderables[:2], screen.hosts_table(hosts))
    for colour in ({}, {"force_terminal": True, "color_system": "truecolor"},
                   {"force_terminal": True, "color_system": "standard"}):
        for width in (60, 200):
            for soft_wrap in (True, False):
                outs = []
                for table in (old, new):
                    buf = io.StringIO()
                    Console(file=buf, width=width, soft_wrap=soft_wrap, **colour).print(table)
                    outs.append(buf.getvalue())
                assert outs[0] == outs[1], (colour, width, soft_wrap)


def test_flow_depth_is_counted_outside_quotes_and_comments_and_100_levels_still_load():
    """Run files are refused past MAX_FLOW_DEPTH nested brackets before PyYAML's scanner
    (quadratic in that depth) sees them; brackets inside quoted scalars and comments do not
    count, and a file at the limit still loads."""
    from orchestrator.runfile import MAX_FLOW_DEPTH, flow_depth, load_yaml_mapping

    text = "a: [1, [2, {b: '[[[', c: \"x[\\\"[[\"}]]  # [[[[\nd: 3 #{{{{\n"
    assert flow_depth(text) == 3
    assert load_yaml_mapping(text, "run file", "f.yaml") == {"a": [1, [2, {"b": "[[[", "c": 'x["[['}]], "d": 3}
    at_limit = "a: " + "[" * MAX_FLOW_DEPTH + "]" * MAX_FLOW_DEPTH + "\n"
    value = load_yaml_mapping(at_limit, "run file", "f.yaml")["a"]
    for _ in range(MAX_FLOW_DEPTH - 1):
        (value,) = value
    assert value == []
