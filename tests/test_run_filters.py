"""``xrun list`` / ``xrun delete`` filters: label selector (kubectl syntax), state and age,
on runs read back from storage."""

from __future__ import annotations

import json
import time

from cli_helpers import xrun
from synthetic_runs import RunShape, write_stored_run

DAY = 86400


def stored(root, name, state, age_s, **spec):
    run_dir = write_stored_run(root, name, RunShape(steps=3), state=state, submitted_at=time.time() - age_s)
    run = json.loads((run_dir / "run.json").read_text())
    run["spec"].update(spec)
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir


def names(r) -> list[str]:
    assert r.returncode == 0, r.stderr
    return sorted(x["name"] for x in json.loads(r.stdout))


def test_list_and_delete_by_label_state_and_age(tmp_path):
    root = tmp_path / "root"
    stored(root, "old-ok", "Succeeded", 10 * DAY, pod_labels={"team": "ml"})
    stored(root, "new-bad", "Failed", 3600, pod_labels={"team": "ml"})
    old_bad = stored(root, "old-bad", "Failed", 8 * DAY, queue="lq")

    def ls(*args: str):
        return xrun("list", "-o", "json", *args, storage=root)

    assert names(ls("-l", "team=ml")) == ["new-bad", "old-ok"]
    assert names(ls("-l", "team!=ml")) == ["old-bad"]
    assert names(ls("-l", "!team")) == ["old-bad"]
    assert names(ls("-l", "kueue.x-k8s.io/queue-name=lq,xrun.dev/run")) == ["old-bad"]
    assert names(ls("--state", "Failed", "--older-than", "7d")) == ["old-bad"]
    assert names(ls("--state", "Failed", "--state", "Succeeded", "--newer-than", "2h")) == ["new-bad"]
    bad = ls("-l", "team=ml=x")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "xrun: error: --selector: 'team=ml=x' is not key=value, key!=value, key or !key")
    bad = ls("--older-than", "a week")
    assert bad.returncode == 2 and "--older-than: 'a week' is not a duration" in bad.stderr

    both = xrun("delete", "old-bad", "--state", "Failed", storage=root)
    assert both.returncode == 2 and "give a run NAME or filters" in both.stderr
    unconfirmed = xrun("delete", "--state", "Failed", "--older-than", "7d", "--purge", storage=root)
    assert (unconfirmed.returncode == 2
            and "refusing to purge 1 run(s) (old-bad) without confirmation" in unconfirmed.stderr)
    assert old_bad.exists()
    done = xrun("delete", "--state", "Failed", "--older-than", "7d", "--purge", "--yes", storage=root)
    assert done.returncode == 0, done.stderr
    assert not old_bad.exists() and names(ls()) == ["new-bad", "old-ok"]
