"""Synthetic runs for the parser, comparison and report tests: logs and stored runs.

Every log is built from the contract's line formats, so the tests fail if the parser and
the contract drift apart. Step times are seeded noise around a base time, the first step
carries a compilation, and checkpoint saves add a stall to the step after the save.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from xrun_contract import (
    CKPT_BLOCKED_LINE,
    CKPT_COMMIT_LINE,
    CKPT_START_LINE,
    CKPT_WAIT_PREVIOUS_LINE,
    EXIT_CODE_LINE,
    FLOPS_LINE,
    HEADER_LINE,
    MEMORY_LINE,
    PARAMS_LINE,
    STEP_LINE,
    WRAPPER_END_LINE,
    WRAPPER_START_LINE,
    Layout,
)


@dataclass
class RunShape:
    steps: int = 60
    seconds: float = 0.150  # steady step time
    jitter: float = 0.004  # gaussian sd
    compile_s: float = 4.0  # added to step 1
    loss0: float = 7.5
    loss_decay: float = 0.02
    tokens_per_step: int = 2048
    tflops_per_step: float = 2.0
    devices: int = 4
    params_billions: float = 0.853
    memory_pct: float = 2.07
    ckpt_every: int = 0
    stall_s: float = 0.0  # blocking time of each save, added to the step after it
    wait_previous_s: float = 0.0
    jax: str = "0.10.2"
    jaxlib: str = "0.10.2"
    process_id: int = 0
    accelerator: str = "v6e-8"
    commit: str = ""
    exit_code: int | None = 0
    seed: int = 0
    config: dict[str, Any] = field(default_factory=lambda: {"preset": "tiny", "steps": 60})

    def samples(self) -> list[dict[str, float]]:
        rng = random.Random(self.seed)
        out = []
        stall_next = 0.0
        for step in range(1, self.steps + 1):
            sec = max(0.001, rng.gauss(self.seconds, self.jitter))
            if step == 1:
                sec += self.compile_s
            sec += stall_next
            blocked, stall_next = stall_next, 0.0
            loss = self.loss0 * (1 - self.loss_decay) ** step + rng.gauss(0, 0.001)
            out.append({"step": step, "seconds": sec, "tflops": self.tflops_per_step / self.devices / sec,
                        "tokens": self.tokens_per_step / self.devices / sec, "loss": loss,
                        "blocked": blocked, "save": bool(self.ckpt_every and step % self.ckpt_every == 0)})
            if out[-1]["save"]:
                stall_next = self.stall_s + self.wait_previous_s
        return out


def log_lines(shape: RunShape, absl: bool = False, attempt: int = 0) -> list[str]:
    """One process's log, line by line (absl prefixes on the training lines when asked)."""
    t0 = 5 * 3600 + 12 * 60

    def px(i: float) -> str:
        if not absl:
            return ""
        h, rem = divmod(int(t0 + i), 3600)
        m, s = divmod(rem, 60)
        return f"I1203 {h:02d}:{m:02d}:{s:02d}.{int((i % 1) * 1e6):06d} 140234 train.py:812] "

    lines = [WRAPPER_START_LINE.format(host=f"0-{shape.process_id}", attempt=attempt, argv='["python3"]')]
    headers = {"jax": shape.jax, "jaxlib": shape.jaxlib, "backend": "tpu", "process_id": shape.process_id,
               "process_count": 2, "global_devices": shape.devices, "accelerator": shape.accelerator,
               "commit": shape.commit, "config": json.dumps(shape.config)}
    lines += [HEADER_LINE.format(key=k, value=v) for k, v in headers.items() if v != ""]
    lines.append(px(0.5) + PARAMS_LINE.format(value=f"{shape.params_billions:.3f}", unit=" billion"))
    lines.append(px(0.6) + FLOPS_LINE.format(total=shape.tflops_per_step, learnable_pct=93.93, attention_pct=6.07))
    lines.append(px(0.7) + MEMORY_LINE.format(used=0.79, total=31.25, pct=shape.memory_pct,
                                               device=f"TPU_0(process={shape.process_id},(0,0,0,0))"))
    clock = 1.0
    for s in shape.samples():
        clock += s["seconds"]
        lines.append(px(clock) + STEP_LINE.format(step=s["step"], seconds=s["seconds"], tflops=s["tflops"],
                                                  tokens=s["tokens"], total_weights=shape.tokens_per_step,
                                                  loss=s["loss"]))
        if s["save"]:
            lines.append(px(clock) + CKPT_START_LINE.format(step=s["step"]))
            if shape.wait_previous_s:
                lines.append(px(clock) + CKPT_WAIT_PREVIOUS_LINE.format(step=s["step"], seconds=shape.wait_previous_s))
            lines.append(px(clock) + CKPT_BLOCKED_LINE.format(step=s["step"], seconds=shape.stall_s))
            lines.append(px(clock) + CKPT_COMMIT_LINE.format(step=s["step"], seconds=shape.stall_s + 2.0))
    if shape.exit_code is not None:
        lines.append(WRAPPER_END_LINE.format(host=f"0-{shape.process_id}", code=shape.exit_code, seconds=clock + 1))
        lines.append(EXIT_CODE_LINE.format(code=shape.exit_code))
    return lines


def glue(lines: list[str], every: int = 3) -> list[str]:
    """Join every ``every`` consecutive lines into one, with no separator (what log shippers do)."""
    return ["".join(lines[i:i + every]) for i in range(0, len(lines), every)]


def write_log(path: Path, shape: RunShape, **kw: Any) -> Path:
    path.write_text("\n".join(log_lines(shape, **kw)) + "\n")
    return path


def write_stored_run(root: Path, name: str, shape: RunShape, branch: str = "main",
                     submitted_at: float | None = None, state: str = "Succeeded",
                     restart_at: int | None = None) -> Path:
    """A run as xrun stores it: run.json, state.json and metrics JSONL (process 0).

    ``restart_at``: attempt 0 dies after that step, attempt 1 restores the last save and
    redoes the steps after it (the save cadence is ``ckpt_every``).
    """
    submitted_at = submitted_at if submitted_at is not None else time.time() - 3600
    start = submitted_at + 20.0  # scheduling + image pull + process start
    run_dir = root / "runs" / name
    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    spec = {"name": name, "accelerator": shape.accelerator, "branch": branch, "commit": shape.commit,
            "image": f"img:{branch}", "env": {}}
    records: list[dict[str, Any]] = []
    t = start

    def rec(kind: str, attempt: int, **kw: Any) -> None:
        records.append({"kind": kind, "time": t, "attempt": attempt, **kw})

    versions = {"jax": shape.jax, "jaxlib": shape.jaxlib, "process_id": "0", "global_devices": str(shape.devices),
                "process_count": "2", "backend": "tpu"}
    samples = shape.samples()
    plan = [(0, s) for s in samples]
    if restart_at is not None:
        restored = (restart_at // shape.ckpt_every) * shape.ckpt_every if shape.ckpt_every else 0
        plan = [(0, s) for s in samples[:restart_at]] + [(1, s) for s in samples[restored:]]
    attempt_started = -1
    transitions = [{"time": start - 5, "state": "Running", "reason": "attempt 0"}]
    for attempt, s in plan:
        if attempt != attempt_started:
            if attempt and s["blocked"]:  # the save before the restore was attempt 0's
                s = {**s, "seconds": s["seconds"] - s["blocked"], "blocked": 0.0}
            if attempt:
                t += 3.0  # failure detected
                transitions.append({"time": t, "state": "Restarting", "reason": "host 0-1 exited with code 42"})
                t += 10.0  # pods restarted
                transitions.append({"time": t, "state": "Running", "reason": "attempt 1"})
                rec("checkpoint", attempt, step=restored, event="restored", seconds=1.0)
            rec("header", attempt, versions=versions, config=shape.config)
            rec("params", attempt, params=int(shape.params_billions * 1e9))
            rec("memory", attempt, used_gb=0.79, total_gb=31.25, pct=shape.memory_pct, device="TPU_0")
            attempt_started = attempt
        t += s["seconds"]
        rec("step", attempt, step=s["step"], seconds=s["seconds"], tflops_per_device=s["tflops"],
            tokens_per_s_per_device=s["tokens"], total_weights=shape.tokens_per_step, loss=s["loss"],
            checkpoint_blocked_s=s["blocked"])
        if s["save"]:
            rec("checkpoint", attempt, step=s["step"], event="started", seconds=0.0)
            rec("checkpoint", attempt, step=s["step"], event="blocked", seconds=shape.stall_s)
    t += 2.0
    rec("end", attempt_started, exit_code=0 if state == "Succeeded" else 1, reason=state)
    transitions.append({"time": t + 1.0, "state": state, "reason": ""})
    half = len(records) // 2
    for i, chunk in enumerate((records[:half], records[half:])):
        (run_dir / "metrics" / f"attempt-000-{i:08d}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in chunk))
    (run_dir / "run.json").write_text(json.dumps({
        "name": name, "spec": spec, "submitted_at": submitted_at,
        "workload": {"versions": versions, "config": shape.config, "accelerator": shape.accelerator,
                     "start_time": start, "end_time": t, "exit_code": 0 if state == "Succeeded" else 1},
    }))
    (run_dir / "state.json").write_text(json.dumps({
        "state": state, "restarts": 1 if restart_at is not None else 0, "transitions": transitions,
        "hosts": {"0-0": {}, "0-1": {}},
    }))
    assert Layout.run_json(name) == f"runs/{name}/run.json"
    return run_dir


def write_nightly_file(path: Path, root: Path, repeats: int) -> Path:
    """A nightly file of two branches (main, feat) x one tiny config on the local backend,
    storing under ``root``: what the tests that replace only the submission run."""
    spec = {"prefix": "nv", "storage": str(root), "slice": {"accelerator": "cpu-1"}, "base": "main",
            "branches": {"main": {"image": "i:a", "commit": "a1"}, "feat": {"image": "i:b", "commit": "b2"}},
            "configs": {"tiny": {"command": "python3 -m workload.train --preset tiny steps=60", "repeats": repeats}},
            "backend": "local", "threshold": "10%"}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
