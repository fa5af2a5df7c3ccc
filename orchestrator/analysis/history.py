"""Nights of a branch: the trend of one figure and the step changes in it.

Pure: history records in (``readers.history``), tables and change points out. A night is
one nightly (its report folder); each run of the branch that night is one sample, so a
change point is judged against the between-run noise the repeats measured.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from orchestrator.analysis.compare import RUN_METRICS
from orchestrator.analysis.stats import change_points
from orchestrator.readers.record import short_commit

METRIC_LABELS = {m[0]: m[1] for m in RUN_METRICS}


@dataclass
class Night:
    nightly: str  # the report folder: unique per nightly
    date: str
    commit: str
    values: list[float] = field(default_factory=list)  # this branch's succeeded runs
    runs: list[str] = field(default_factory=list)
    incomplete: int = 0

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None


@dataclass
class ChangePoint:
    index: int  # the first night after the change
    night: Night
    previous: Night
    p_value: float
    delta_pct: float
    n_before: int
    n_after: int

    def sentence(self, metric: str) -> str:
        prev, cur = self.previous, self.night
        return (f"{METRIC_LABELS.get(metric, metric)} changed {self.delta_pct:+.1f}% on the night of "
                f"{cur.date} ({cur.nightly}): between commit {short_commit(prev.commit) or '?'} ({prev.nightly}) and "
                f"{short_commit(cur.commit) or '?'} (Mann-Whitney p={self.p_value:.3f}, "
                f"n={self.n_before}/{self.n_after} runs)")


def nights(records: list[dict[str, Any]], branch: str, metric: str, config: str | None = None,
           last: int | None = None) -> list[Night]:
    """The branch's nights in time order, each with its runs' values of ``metric``."""
    by: dict[str, Night] = {}
    for r in sorted(records, key=lambda r: (r.get("started", ""), r.get("nightly", ""))):
        if r.get("branch") != branch or (config and r.get("config") != config):
            continue
        key = r.get("nightly", "")
        n = by.setdefault(key, Night(key, r.get("date", ""), r.get("commit", "")))
        v = (r.get("figures") or {}).get(metric)
        if r.get("state") == "Succeeded" and isinstance(v, int | float):
            n.values.append(float(v))
            n.runs.append(r.get("run", ""))
        elif r.get("state") != "Succeeded":
            n.incomplete += 1
    out = list(by.values())
    return out[-last:] if last else out


def detect(ns: list[Night], metric: str, alpha: float = 0.05, threshold_pct: float = 5.0) -> list[ChangePoint]:
    """Step changes between nights (``stats.change_points`` on each night's runs)."""
    withdata = [n for n in ns if n.values]
    return [ChangePoint(k, withdata[k], withdata[k - 1], p, d, nb, na)
            for k, p, d, nb, na in change_points([n.values for n in withdata], alpha, threshold_pct)]


def trend_text(ns: list[Night], metric: str, branch: str, cps: list[ChangePoint]) -> str:
    """The table `xrun history` prints: one line per night, change points marked."""
    label = METRIC_LABELS.get(metric, metric)
    lines = [f"{label} on {branch}, {len(ns)} night(s)", "",
             f"{'night':<24} {'commit':<12} {'runs':>4} {'median':>12} {'min':>12} {'max':>12}  note"]
    starts = {cp.night.nightly: cp for cp in cps}
    for n in ns:
        med = f"{n.median:.5g}" if n.values else "-"
        lo = f"{min(n.values):.5g}" if n.values else "-"
        hi = f"{max(n.values):.5g}" if n.values else "-"
        note = []
        if n.nightly in starts:
            note.append(f"<- change {starts[n.nightly].delta_pct:+.1f}%")
        if n.incomplete:
            note.append(f"{n.incomplete} run(s) incomplete")
        lines.append((f"{n.nightly:<24} {short_commit(n.commit):<12} {len(n.values):>4} {med:>12} {lo:>12} {hi:>12}  "
                      + "; ".join(note)).rstrip())
    lines.append("")
    if cps:
        lines += [f"Change point: {cp.sentence(metric)}." for cp in cps]
    elif len([n for n in ns if n.values]) < 2:
        lines.append("No change point test: one night with results so far; a change is found "
                     "between nights, so it needs a second night.")
    elif max(len(n.values) for n in ns) < 4:
        most = max(len(n.values) for n in ns)
        lines.append(f"No change point test: fewer than 4 runs on each side of any night: at most "
                     f"{most} succeeded run(s) per night (use repeats >= 4).")
    elif sum(len(n.values) for n in ns) < 8:
        lines.append("No change point test: fewer than 4 succeeded runs on each side of any night.")
    else:
        lines.append("No step change beyond noise between nights.")
    return "\n".join(lines) + "\n"
