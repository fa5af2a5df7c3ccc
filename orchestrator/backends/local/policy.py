"""The Job and JobSet failure policies, taken from the manifest, as the controllers apply
them to the pods that failed in one sync (kubernetes pkg/controller/job podFailurePolicy,
JobSet failurePolicy rules): which Jobs failed and why, and what the JobSet does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.backends.local.pods import Pod
from xrun_contract.k8s import JobFailureReasons

# The Job controller syncs a Job at most once per this period after its pods' events
# (kubernetes pkg/controller/job/job_controller.go, syncJobBatchPeriod): pods of one Job that
# fail within it are judged in one syncJob, where a podFailurePolicy FailJob match on any
# of them (getFailJobMessage walks every failed pod) comes before counting the failures
# against the backoff limit.
SYNC_JOB_BATCH_SECONDS = 1.0


def _fail_job_rule_index(job_spec: dict[str, Any], code: int, container: str = "") -> int | None:
    """The index of the Job's podFailurePolicy FailJob rule that matches this exit code of
    this container, or None. (A rule's containerName restricts it to that container's code.)"""
    for i, rule in enumerate(job_spec.get("podFailurePolicy", {}).get("rules", [])):
        on = rule.get("onExitCodes")
        if rule.get("action") != "FailJob" or not on or code == 0:
            continue
        if on.get("containerName") and container and on["containerName"] != container:
            continue
        values = set(on.get("values", []))
        if (on.get("operator") == "In") == (code in values):
            return i
    return None


def _fails_job_for_good(job_spec: dict[str, Any], code: int, container: str = "") -> bool:
    """Does a podFailurePolicy FailJob rule of the Job match this exit code of this container?"""
    return _fail_job_rule_index(job_spec, code, container) is not None


def _ended(pod: Pod) -> float:
    return pod.failed_at or pod.exited_at or 0.0


@dataclass
class FailedJob:
    """A Job as the JobSet controller sees it once the Job controller has failed it."""

    replicated_job: str
    name: str
    reason: str  # the JobFailed condition's reason: PodFailurePolicy or BackoffLimitExceeded
    message: str
    failed_at: float  # when it failed (its first failed pod's end, see failed_jobs)
    pod: Pod  # the pod whose failure gave the reason: the host to name


@dataclass
class FailureDecision:
    """What the JobSet's failurePolicy does about the failed Jobs of one sync."""

    action: str  # FailJobSet, RestartJobSet, RestartJobSetAndIgnoreMaxRestarts, FailedJobs
    job: FailedJob  # the Job the action names ("first failed job: ...")
    rule: str = ""  # the matching rule's name; "" when none matched (the default action)


def failed_jobs(failed: list[Pod], job_specs: dict[str, dict[str, Any]]) -> list[FailedJob]:
    """The Jobs these failed pods fail, as the Job controller judges each (kubernetes
    pkg/controller/job/job_controller.go syncJob): the pods of one Job that failed within
    SYNC_JOB_BATCH_SECONDS of its first failure are judged together, and a podFailurePolicy
    FailJob match among them (getFailJobMessage walks every failed pod) gives reason
    PodFailurePolicy even if a restartable failure came a moment earlier: a host that exits
    with a non-restartable code tears down the collective, and its peers' restartable exits
    can land before its own. Otherwise BackoffLimitExceeded (xrun's backoffLimit is 0).

    ``failed_at`` is the Job's first failed pod's end. Since Kubernetes 1.31 the Job
    controller first sets FailureTarget, deletes the Job's other pods and sets Failed (the
    time JobSet orders by) only once they are terminal (job_controller.go
    delayTerminalCondition, enactJobFinished); here every pod is stopped together once the
    JobSet has decided, so the first failure stands for it."""
    jobs: dict[str, list[Pod]] = {}
    for p in failed:
        jobs.setdefault(p.job or str(p.slice_index), []).append(p)
    out = []
    for name, pods in jobs.items():
        pods = sorted(pods, key=_ended)
        batch = [p for p in pods if _ended(p) <= _ended(pods[0]) + SYNC_JOB_BATCH_SECONDS]
        job_spec = job_specs.get(pods[0].replicated_job) or next(iter(job_specs.values()))
        hit = next((p for p in batch if p.exit_code is not None
                    and _fails_job_for_good(job_spec, p.exit_code, p.failed_container)), None)
        if hit is not None:
            # kubernetes pkg/controller/job/pod_failure_policy.go matchPodFailurePolicy's message.
            index = _fail_job_rule_index(job_spec, hit.exit_code or 0, hit.failed_container)
            out.append(FailedJob(hit.replicated_job, name, JobFailureReasons.POD_FAILURE_POLICY,
                                 f"Container {hit.failed_container} for pod {hit.namespace}/{hit.name} failed with "
                                 f"exit code {hit.exit_code} matching FailJob rule at index {index}",
                                 _ended(pods[0]), hit))
        else:
            out.append(FailedJob(pods[0].replicated_job, name, JobFailureReasons.BACKOFF_LIMIT_EXCEEDED,
                                 "Job has reached the specified backoff limit", _ended(pods[0]), pods[0]))
    return out


def _rule_applies(rule: dict[str, Any], job: FailedJob) -> bool:
    """jobset pkg/controllers/failure_policy.go ruleIsApplicable: the Job's failure reason
    among onJobFailureReasons, its message matching one of onJobFailureMessagePatterns, its
    replicatedJob among targetReplicatedJobs (each: any, when empty)."""
    reasons = rule.get("onJobFailureReasons") or []
    patterns = rule.get("onJobFailureMessagePatterns") or []
    targets = rule.get("targetReplicatedJobs") or []
    return ((not reasons or job.reason in reasons)
            and (not patterns or any(_search(p, job.message) for p in patterns))
            and (not targets or job.replicated_job in targets))


def _search(pattern: str, text: str) -> bool:
    """Go's regexp.MatchString: a match anywhere; an invalid pattern matches nothing."""
    try:
        return re.search(pattern, text) is not None
    except re.error:
        return False


def first_failed_policy_rule_and_job(rules: list[dict[str, Any]],
                                     jobs: list[FailedJob]) -> tuple[dict[str, Any] | None, FailedJob | None]:
    """jobset pkg/controllers/failure_policy.go findFirstFailedPolicyRuleAndJob: the RULES
    first, in order; the first rule that any failed Job matches wins, with the earliest-
    failed Job among those it matches. A Job that failed earlier but matches only a later
    rule does not outrank it."""
    for rule in rules:
        match: FailedJob | None = None
        for job in jobs:
            if _rule_applies(rule, job) and (match is None or job.failed_at < match.failed_at):
                match = job
        if match is not None:
            return rule, match
    return None, None


def failure_decision(manifest: dict[str, Any], failed: list[Pod]) -> FailureDecision:
    """jobset pkg/controllers/failure_policy.go executeFailurePolicy on the Jobs these
    failed pods fail: no failurePolicy -> the JobSet fails (FailedJobs) naming the first
    failed Job (findFirstFailedJob); else the action of the first rule any failed Job
    matches (first_failed_policy_rule_and_job), or RestartJobSet for the first failed Job
    when none does (defaultFailurePolicyRuleAction)."""
    spec = manifest["spec"]
    job_specs = {rj["name"]: rj["template"]["spec"] for rj in spec["replicatedJobs"]}
    jobs = failed_jobs(failed, job_specs)
    first = min(jobs, key=lambda j: j.failed_at)
    policy = spec.get("failurePolicy")
    if policy is None:
        return FailureDecision("FailedJobs", first)
    rule, job = first_failed_policy_rule_and_job(policy.get("rules") or [], jobs)
    if rule is None or job is None:
        return FailureDecision("RestartJobSet", first)
    return FailureDecision(rule["action"], job, rule.get("name", ""))
