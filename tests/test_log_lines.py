"""Each log line is defined once (xrun_contract.lines: a format, its regex derived from it)
and every line the workload writes has a reader that takes something from it."""

from __future__ import annotations

import ast
import re
import string
from pathlib import Path

import pytest

from orchestrator.readers.logparse import LogParser
from xrun_contract import lines

ROOT = Path(__file__).resolve().parents[1]
# One value per field name a line format uses (a new field needs one here).
SAMPLES = {
    "step": 7, "previous": 5, "process": 3, "attempt": 2, "host": "0-1", "seconds": 1.25,
    "error": "storage: gs://b/x: unreachable", "key": "versions", "value": "jax=0.10.2 mesh={}",
    "tflops": "12.5", "tokens": "1234", "total_weights": 4096, "loss": "2.3456",
    "unit": " million", "total": 0.25, "learnable_pct": 93.93, "attention_pct": 6.07,
    "used": 1.5, "pct": 9.375, "device": "TPU_0", "activity": "training", "argv": '["python"]',
    "code": 42, "json": '{"ok": true}', "kind": "user", "why": "ValueError: bad",
}
SAMPLES_OF = {"PARAMS_LINE": {"value": "0.107"}}  # where a name means another thing
FORMATS = {name: fmt for name, fmt in vars(lines).items()
           if name.endswith("_LINE") and isinstance(fmt, str)}
PAIRS = {name: getattr(lines, name[:-5] + "_RE") for name in FORMATS
         if isinstance(getattr(lines, name[:-5] + "_RE", None), re.Pattern)}


def sample(name: str) -> tuple[str, dict[str, str]]:
    """Line ``name`` filled from SAMPLES, and each field as it reads in the line."""
    fmt, own = FORMATS[name], SAMPLES_OF.get(name, {})
    values = {f: own.get(f, SAMPLES[f]) for _, f, _, _ in string.Formatter().parse(fmt) if f}
    shown = {f: format(values[f], spec or "")
             for _, f, spec, _ in string.Formatter().parse(fmt) if f}
    return fmt.format(**values), shown


def test_every_regex_is_derived_from_its_format_and_reads_it_back():
    assert len(PAIRS) >= 18
    for name, regex in PAIRS.items():
        line, shown = sample(name)
        m = regex.search(line)
        assert m, f"{name[:-5]}_RE does not read {line!r}"
        for field, text in shown.items():
            if field in regex.groupindex:
                assert m[field] == text.strip(), (name, field, m[field], text)
    # ... derived, never written by hand: each X_RE is line_re(X_LINE, ...).
    tree = ast.parse(Path(lines.__file__).read_text())
    derived = {node.targets[0].id: node.value.args[0].id for node in tree.body
               if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
               and getattr(node.value.func, "id", "") == "line_re"}
    for name in PAIRS:
        assert derived.get(name[:-5] + "_RE") == name, f"{name[:-5]}_RE is not line_re({name})"


def test_line_re_escapes_literals_and_refuses_an_unknown_field():
    assert lines.line_re("a (b) {step}.").fullmatch("a (b) 12.")
    assert not lines.line_re("a (b) {step}.").fullmatch("a xbx 12x")
    with pytest.raises(ValueError, match="no pattern for field 'mystery'"):
        lines.line_re("x {mystery}")


def _written_by_the_workload() -> set[str]:
    """The contract's line formats the workload's code writes: the names it uses (a
    ``*_LINE``, or ``format_<x>_line`` for X_LINE) and the launcher's printf lines."""
    used: set[str] = set()
    for path in (ROOT / "workload").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
            if not isinstance(name, str):
                continue
            if name in FORMATS:
                used.add(name)
            m = re.fullmatch(r"format_(\w+)_line", name)
            if m and f"{m[1].upper()}_LINE" in FORMATS:
                used.add(f"{m[1].upper()}_LINE")
    launcher = (ROOT / "workload" / "launcher.sh").read_text()
    for name, fmt in FORMATS.items():
        literal = fmt.split("{", 1)[0]
        if re.search(r"(printf '|emit \")" + re.escape(literal), launcher):
            used.add(name)
    return used


def _reading(text: str) -> dict:
    """What the parser takes from ``text`` followed by a step line (a line may only change
    how the next step is counted: the wrapper's start line sets its attempt)."""
    parser = LogParser()
    parser.feed(text + lines.format_step_line(9, 1.0, 2.0, 3.0, 64, 2.5) + "\n")
    rec = parser.finish()
    return {k: repr(list(v.rows()) if k == "steps" else v) for k, v in vars(rec).items()}  # nan


def test_every_line_the_workload_writes_has_a_reader():
    written = _written_by_the_workload()
    # The lines the workload and its launcher are known to write: a line dropped from the
    # scan above (renamed, moved) would otherwise pass unseen.
    assert {"STEP_LINE", "HEADER_LINE", "PHASE_LINE", "FAILURE_LINE", "CKPT_COMMIT_LINE",
            "CKPT_DEFERRED_STORAGE_LINE", "CKPT_WRITE_FAILED_LINE", "WRAPPER_START_LINE",
            "WRAPPER_END_LINE", "EXIT_CODE_LINE", "PROBE_LINE", "PARAMS_LINE",
            "FLOPS_LINE", "MEMORY_LINE"} <= written
    empty = _reading("")
    for name in sorted(written):
        line, _ = sample(name)
        if name == "PROBE_LINE":  # xrun doctor reads the probe pod's output itself
            from orchestrator.services import doctor

            assert doctor.PROBE_RE is lines.PROBE_RE and lines.PROBE_RE.match(line)
            continue
        got = _reading(line + "\n")
        assert got != empty, f"{name}: nothing reads {line!r}"


def test_every_regex_of_a_line_is_read_outside_the_contract():
    """A regex no reader uses is a line read by nobody (or a dead copy): delete one or the
    other."""
    readers = "\n".join(p.read_text() for p in (ROOT / "orchestrator").rglob("*.py"))
    for name in PAIRS:
        regex = name[:-5] + "_RE"
        assert re.search(rf"\b{regex}\b", readers), f"{regex} is read by no reader"


def test_a_storage_deferred_save_read_from_a_log_counts_as_one():
    parser = LogParser()
    parser.feed(lines.CKPT_DEFERRED_STORAGE_LINE.format(step=40, error="503 from gs://b") + "\n")
    rec = parser.finish()
    assert rec.checkpoint_totals.get("deferred") == 1
    assert rec.checkpoint_totals.get("deferred_storage") == 1
