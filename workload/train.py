"""Train the decoder on every host of the job: ``python -m workload.train``.

Usage::

    python -m workload.train [--config FILE.yaml] [--preset NAME] [--storage ROOT]
                             [--run-name NAME] [key=value ...]

The contract env (``xrun_contract.Env``) says who this process is; ``--storage`` and
``--run-name`` override ``XRUN_STORAGE`` / ``XRUN_RUN_NAME`` (standalone runs, benchmarks).
Without a storage root nothing is written (no metrics, no checkpoints).

Step numbering: steps are 1..``steps``. "completed step: N" means N optimizer updates have
been applied; the checkpoint of step N holds the state after those N updates and the data
position of step N + 1, so a run that restores step 4 logs step 5 next.

Written under ``<storage>/runs/<run>/``: ``metrics/attempt-AAA-SSSSSSSS.jsonl`` (process 0),
``run.json`` (its ``workload`` section, process 0), ``checkpoints/<step>/`` (Orbax, all).

Exit codes: 0 done; ``XRUN_RESTARTABLE_EXIT_CODE`` (default 42) after a SIGTERM save
committed, and after an infrastructure failure (a peer or the coordinator died, storage
kept failing: ``workload.failures``); ``PLATFORM_MISMATCH_EXIT_CODE`` (4) when the manifest
asked for TPU/GPU and JAX found only CPU; the code of ``XRUN_TEST_FAIL_AT_STEP``; 1 on an
exception in user code (traceback on stderr).

Startup is recorded as phases (``xrun_contract.PHASES``: a "phase" record and an
"xrun phase: ..." line each); the train step compiles in a thread while the checkpoint
manager opens and the latest step restores.

The parts: ``workload.optim`` (optimizer, loss), ``workload.program`` (the compiled init and
train step, the quick/optimized switch), ``workload.loop`` (the steps), ``workload.lifecycle``
(signals, test faults, checkpoint manager); this module is the process (arguments, exit).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from workload.config import arg_parser, load_config
from workload.distributed import (
    Cluster,
    PlatformMismatch,
    check_platform,
    configure_platform,
    initialize,
)
from workload.lifecycle import (  # noqa: F401 - re-exported: tests and benches import them here
    Preemption,
    fail_at_step,
    preload,
    staging_budget,
)
from workload.loop import STEPS_AHEAD, InFlight, step_results, train  # noqa: F401
from workload.metrics import Metrics, process_start_time, say, update_run_json
from workload.optim import (  # noqa: F401
    ADAM_EPS,
    clip_by_global_norm,
    clip_factor,
    cross_entropy,
    embedding_gradient,
    embedding_route,
    make_adamw,
    make_optimizer,
    optimizer_step,
)
from workload.peers import EXIT_KEY, POLL_S, Peers, exit_notice
from workload.program import (  # noqa: F401
    INIT_COMPILER_OPTIONS,
    QUICK_COMPILER_OPTIONS,
    Program,
    StepSwitch,
    init_key,
)
from xrun_contract import (
    FAILURE_LINE,
    PHASE_ACTIVITY,
    PHASE_LINE,
    PHASE_TOOK,
    PLATFORM_MISMATCH_EXIT_CODE,
    USER_ERROR_EXIT_CODE,
    Env,
    significant,
)
from xrun_contract.storage import open_storage

# ---------------------------------------------------------------------------------------
# The process: arguments, env, header, the loop, checkpoints, signals, exit.


PROCESS_START = process_start_time()  # the startup timeline's zero


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, as ``workload.config.arg_parser`` defines it (the orchestrator checks
    the same arguments before submitting)."""
    return arg_parser(exit_on_error=True).parse_args(argv)


# How long a process that learned of a peer's own end leaves its main thread to end by
# itself (a collective that fails fast on the lost connection, then the usual record),
# before it exits from the watching thread: the main thread may be in a barrier that only
# the peer could complete (a checkpoint round waits up to 10 minutes, Orbax's longer).
PEER_EXIT_GRACE_S = 2.0


def watch_peer_exits(peers: Peers, metrics: Metrics, exit_code: int,
                     ended: threading.Event) -> threading.Thread | None:
    """A peer that ended on its own (an error, a test failure, a failed write) never joins
    another collective: without this, its peers waited in their next barrier until the
    supervisor's kill after the grace period, and a restart waited with them (JobSet recreates
    the pods once the old ones are gone). Exits restartable, unless this process ended first."""

    def on_exit(message: str) -> None:
        process, code, why = exit_notice(message)
        if process == str(peers.process_id) or ended.wait(PEER_EXIT_GRACE_S):
            return
        reason = f"process {process} exited with code {code} ({why}); no collective completes without it"
        say(FAILURE_LINE.format(kind="infrastructure", why=reason, code=exit_code))
        metrics.end_and_exit(exit_code, reason, failure="infrastructure")

    return peers.watch(on_exit, ended, key=EXIT_KEY, name="xrun-peer-exit")


def main(argv: list[str] | None = None) -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1`: stacks to stderr
    args = parse_args(argv)
    preemption = Preemption()
    cluster = Cluster.from_env()
    yaml_text = Path(args.config).read_text() if args.config else None
    cfg = load_config(args.preset, args.overrides, yaml_text)
    root = args.storage or os.environ.get(Env.STORAGE) or None
    run = args.run_name or os.environ.get(Env.RUN_NAME) or ("standalone" if root else None)
    storage = open_storage(root) if root else None

    # Until jax.distributed runs, the env's process id says who speaks (process 0).
    early: list[tuple[str, float]] = [("process_start", PROCESS_START)]
    configure_platform(cluster)  # imports jax
    early.append(("imports", time.time()))
    if cluster.process_id == 0:
        took = early[-1][1] - PROCESS_START
        say(PHASE_LINE.format(activity=PHASE_ACTIVITY["imports"], seconds=took)
            + PHASE_TOOK.format(activity=PHASE_ACTIVITY["process_start"], seconds=significant(took, 3)))
    preload(storage, run, cfg)  # while jax.distributed.initialize waits for the peers
    try:
        if initialize(cluster):
            preemption.handed_to_jax()
    except Exception as e:  # noqa: BLE001 - e.g. the coordinator never answered
        from workload.failures import classify

        traceback.print_exc()
        verdict = classify(e)
        code = cluster.restartable_exit_code if verdict.restartable else USER_ERROR_EXIT_CODE
        say(FAILURE_LINE.format(kind=verdict.kind, why=verdict.why, code=code))
        os._exit(code)  # no peers to wait for; nothing written yet
    import jax

    jax.devices()  # the devices open here (seconds on a TPU chip): part of this phase
    early.append(("distributed", time.time()))

    primary = jax.process_index() == 0
    metrics = Metrics(storage, run, cluster.attempt, primary, process_start=PROCESS_START)
    for phase, at in early:
        metrics.phase(phase, at=at, quiet=phase != "distributed")
    run_info: dict[str, Any] = {"attempt": cluster.attempt, "start_time": time.time(),
                                "end_time": None, "exit_code": None}
    failure: dict[str, str] = {}
    ended = threading.Event()
    peers = Peers(prefix="xrun/exit/round") if jax.process_count() > 1 else None
    watcher = watch_peer_exits(peers, metrics, cluster.restartable_exit_code, ended) if peers else None
    try:
        check_platform(cluster)
        code, reason, clean = train(cfg, cluster, preemption, metrics, storage, run, run_info)
    except KeyboardInterrupt:
        code, reason, clean = 130, "interrupted (SIGINT)", False
    except PlatformMismatch as e:
        print(f"xrun: {e}", file=sys.stderr, flush=True)
        code, reason, clean = PLATFORM_MISMATCH_EXIT_CODE, f"platform: {e}", False
        failure = {"failure": "platform"}
    except Exception as e:  # noqa: BLE001 - classified, reported, then exit
        from workload.failures import classify

        traceback.print_exc()
        sys.stderr.flush()
        verdict = classify(e)
        code = cluster.restartable_exit_code if verdict.restartable else USER_ERROR_EXIT_CODE
        say(FAILURE_LINE.format(kind=verdict.kind, why=verdict.why, code=code))
        reason, clean = f"exception: {type(e).__name__}: {e}", False
        failure = {"failure": verdict.kind}
    ended.set()
    if peers is not None and not clean:
        peers.publish_exit(code, reason)  # before storage writes, which may take their time
    run_info.update(failure)
    metrics.end(code, reason, data_bytes_read=run_info.get("data_bytes_read"),
                failure=failure.get("failure"))
    try:
        metrics.close()
    except Exception as e:  # noqa: BLE001 - storage down at exit: the exit code matters more
        print(f"xrun: last metrics records not written: {e}", file=sys.stderr, flush=True)
    if storage is not None and run and primary:
        run_info.update(end_time=time.time(), exit_code=code, reason=reason)
        try:
            update_run_json(storage, run, **run_info)
        except Exception:  # noqa: BLE001 - the exit code matters more than run.json
            traceback.print_exc()
    sys.stdout.flush()
    if not clean:
        os._exit(code)  # the peers go on without us: skip jax.distributed's shutdown barrier
    if watcher is not None:
        # Out of its long poll (at most 1 s) before the client goes and the interpreter
        # finalizes: a poll that returned once finalizing had begun ended the thread inside
        # jaxlib's C++ frames ("terminate called after throwing an instance of ''", SIGABRT,
        # exit 134 after a finished run; 2 of 3 README runs at a load of 18).
        watcher.join(timeout=2 * POLL_S)
    if jax.distributed.is_initialized():
        jax.distributed.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
