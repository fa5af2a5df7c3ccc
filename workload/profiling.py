"""``profile=START:STEPS``: a ``jax.profiler`` trace of those steps, written to
``<root>/runs/<name>/profile/`` (``xrun_contract.Layout.profile``), the layout TensorBoard's
profile plugin reads (``plugins/profile/<session>/*.xplane.pb``), as MaxText's
``profiler=xplane`` writes its traces. The trace is written to a local folder and copied to
the storage root when the last traced step's results are read (gs:// included: JAX's
profiler writes local files only without TensorFlow's file systems). Its top ops by device
time (``xrun_contract.xplane``) go into the run.json record, for ``xrun status``/``report``."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from workload.config import parse_profile
from workload.metrics import say
from xrun_contract import Layout
from xrun_contract.storage import Storage
from xrun_contract.xplane import ops_text, top_ops

TOP_OPS = 10  # ops kept in run.json

class StepProfile:
    """Starts the trace before step START is dispatched, stops it once step START+STEPS-1's
    results are read (or when the loop ends first), then copies it to storage."""

    def __init__(self, spec: str, storage: Storage | None, run: str | None, primary: bool):
        parsed = parse_profile(spec)
        self.start, self.last = (parsed[0], parsed[0] + parsed[1] - 1) if parsed else (0, -1)
        self.storage, self.run, self.primary = storage, run, primary
        self.folder: Path | None = None
        self.info: dict[str, Any] | None = None

    def before_dispatch(self, step: int) -> None:
        if step == self.start and self.folder is None:
            import jax

            self.folder = Path(tempfile.mkdtemp(prefix="xrun-profile-"))
            jax.profiler.start_trace(str(self.folder))

    def after_read(self, step: int) -> dict[str, Any] | None:
        """The trace's record (where, which steps) once written, else None."""
        if self.folder is not None and self.info is None and step >= self.last:
            return self.finish(step)
        return None

    def finish(self, step: int) -> dict[str, Any] | None:
        if self.folder is None or self.info is not None:
            return None
        import jax

        jax.profiler.stop_trace()
        files = sorted(p for p in self.folder.rglob("*") if p.is_file())
        summary = summarise(files)
        where = str(self.folder)
        if self.storage is not None and self.run:
            prefix = Layout.profile(self.run)
            for p in files:
                self.storage.write_bytes(f"{prefix}/{p.relative_to(self.folder).as_posix()}",
                                         p.read_bytes())
            where = self.storage.url(prefix)
            shutil.rmtree(self.folder, ignore_errors=True)
        self.info = {"path": where, "steps": [self.start, min(step, self.last)],
                     "files": len(files), **summary}
        if self.primary:
            say(f"xrun: profile of steps {self.start}-{min(step, self.last)} written to {where} "
                "(tensorboard --logdir there, Profile tab)")
            if summary.get("top_ops"):
                say("xrun: profile's top ops by device time: " + ops_text(summary["top_ops"], 5))
        return self.info


def summarise(files: list[Path]) -> dict[str, Any]:
    """``{"top_ops": ...}`` of the trace's first ``*.xplane.pb`` (one process writes one), or
    ``{"top_ops_error": why}``: a trace this reader cannot read leaves the run as it was."""
    traces = [p for p in files if p.name.endswith(".xplane.pb")]
    if not traces:
        return {}
    try:
        return {"top_ops": top_ops(traces[0].read_bytes(), TOP_OPS)}
    except Exception as e:  # noqa: BLE001 - a summary, never a failed run
        return {"top_ops_error": f"{traces[0].name}: {e}"}

