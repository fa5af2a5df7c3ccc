"""Compare and report: runs in (names, run paths or log files), comparisons out.

Every run is read through the one record (``readers.loaders.load_run``) whatever its
source; a storage client failure is "unreachable" (exit 3), an argument that is not a run
is bad input (exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.analysis.compare import Comparison
from orchestrator.analysis.compare import compare as compare_records
from orchestrator.analysis.report import report_for
from orchestrator.readers.loaders import load_run
from orchestrator.readers.record import RunRecord
from xrun_contract.errors import EXIT_UNREACHABLE, XrunError


def load(arg: str, storage_root: str, what: str) -> RunRecord:
    try:
        return load_run(arg, storage_root, what)
    except XrunError:
        raise
    except Exception as e:  # noqa: BLE001 - a storage client error: unreachable, not bad input
        raise XrunError(f"{what}: cannot read {arg} from {storage_root}: {e}", EXIT_UNREACHABLE) from None


# A branch name as git accepts it (refs.c, check_refname_format(): no whitespace or
# control characters, none of ~^:?*[\\, no "..", no "@{", no leading "-", no "/" or "."
# at either end, no ".lock" at the end), and an abbreviated or full commit (4-40 hex
# digits, git's minimum abbreviation is 4).
_BRANCH_RE = re.compile(r"(?!-)(?!.*\.\.)(?!.*@\{)(?!.*\.lock$)[^\s~^:?*\[\\\x00-\x1f\x7f]+(?<![/.])")
_COMMIT_RE = re.compile(r"[0-9a-fA-F]{4,40}")
LABEL_ALLOWED = "branch@commit (e.g. main@574ad3fb9), branch, or @commit"


def parse_label(text: str, option: str) -> tuple[str, str]:
    """'main@574ad3fb9' -> ('main', '574ad3fb9'); 'main' -> ('main', ''); '@574ad3f' ->
    ('', '574ad3f'). Bad input names ``option`` (exit 2)."""
    branch, sep, commit = text.strip().rpartition("@") if "@" in text else (text.strip(), "", "")
    if (not branch and not commit) or (branch and (branch.startswith("/") or not _BRANCH_RE.fullmatch(branch))) \
            or (sep and not _COMMIT_RE.fullmatch(commit)):
        raise XrunError(f"{option}: {text!r} is not a label; use {LABEL_ALLOWED}")
    return branch, commit


def apply_label(rec: RunRecord, label: tuple[str, str]) -> None:
    """A label from the command line names the run's branch and commit (a log carries
    neither): it feeds the table's header and the same-commit warning."""
    branch, commit = label
    if branch:
        rec.branch = branch
    if commit:
        rec.commit = commit


def compare(base: str, candidate: str, storage_root: str, *, threshold_pct: float, alpha: float,
            warmup: int, label_a: str | None = None, label_b: str | None = None,
            peak_tflops: float | None = None) -> Comparison:
    """CANDIDATE against BASE; ``label_a``/``label_b`` ("branch@commit") name each side."""
    la = parse_label(label_a, "--label-a") if label_a is not None else None
    lb = parse_label(label_b, "--label-b") if label_b is not None else None
    b = load(base, storage_root, "BASE")
    c = load(candidate, storage_root, "CANDIDATE")
    if la:
        apply_label(b, la)
    if lb:
        apply_label(c, lb)
    return compare_records(b, c, threshold_pct=threshold_pct, alpha=alpha, warmup=warmup,
                           peak_tflops=peak_tflops)


def comparison_html(result: Comparison) -> str:
    return report_for(result.base, [result.cand], [result])


def report(base: str, candidates: Sequence[str], storage_root: str, *, threshold_pct: float,
           alpha: float, warmup: int, title: str,
           peak_tflops: float | None = None) -> tuple[str, list[Comparison]]:
    """The self-contained HTML report of every candidate against the base (no candidate: a
    single-run report)."""
    b = load(base, storage_root, "BASE" if candidates else "RUN")
    cands = [load(c, storage_root, f"CANDIDATE {i + 1}" if len(candidates) > 1 else "CANDIDATE")
             for i, c in enumerate(candidates)]
    results = [compare_records(b, c, threshold_pct=threshold_pct, alpha=alpha, warmup=warmup,
                               peak_tflops=peak_tflops) for c in cands]
    return report_for(b, cands, results, title=title), results


def history(storage_root: str, *, branch: str, metric: str, config: str | None, last: int,
            alpha: float, threshold_pct: float) -> tuple[str, list]:
    """`xrun history`: the branch's nights of one figure and the change points in them."""
    from orchestrator.analysis.compare import RUN_METRIC_KEYS
    from orchestrator.analysis.history import detect, nights, trend_text
    from orchestrator.readers.history import read_history
    from xrun_contract.storage import open_storage

    if metric not in RUN_METRIC_KEYS:
        raise XrunError(f"--metric: {metric!r} is not a history figure; one of {', '.join(RUN_METRIC_KEYS)}")
    try:
        storage = open_storage(storage_root)
    except ValueError as e:
        raise XrunError(f"--storage: {e}") from None
    records = read_history(storage)
    if not records:
        raise XrunError(f"--storage: no nightly history under {storage.url('history')} (run xrun nightly first)")
    branches = sorted({str(r.get("branch")) for r in records})
    if branch not in branches:
        raise XrunError(f"--branch: no history for {branch!r}; branches with history: {', '.join(branches)}")
    configs = sorted({str(r.get("config")) for r in records if r.get("branch") == branch})
    if config is not None and config not in configs:
        raise XrunError(f"--config: no history for {config!r} on {branch}; configs: {', '.join(configs)}")
    out, cps_all = [], []
    for cfg in [config] if config else configs:
        ns = nights(records, branch, metric, cfg, last)
        cps = detect(ns, metric, alpha, threshold_pct)
        cps_all += cps
        out.append(f"config {cfg}: " + trend_text(ns, metric, branch, cps))
    return "\n".join(out), cps_all
