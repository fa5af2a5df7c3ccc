"""Agreement among the job's processes, through JAX's coordination service (no device work).

Checkpoint decisions (save now or defer, restore this step or fall back, stop on a failed
write) must be taken identically by every process: Orbax's saves and restores are collective
(``CheckpointManager.save`` starts with a barrier), so a process that decides differently
deadlocks the others. ``Peers.gather`` is a round in which every process publishes a short
string and gets everyone's: key-value set, a barrier, a directory get. It is the coordination
service ``jax.distributed.initialize`` started (the same client ``jax.experimental.
multihost_utils.reached_preemption_sync_point`` and Orbax's ``multihost`` barriers use), so it
neither touches the devices nor waits behind a step's collectives.

A failure flag (``publish_failure``) is a key every process can long-poll (``watch``): a
process stuck where no round can reach it (inside an Orbax barrier that a failed peer will
never join) still learns of the failure within a second. An exit flag (``publish_exit``)
does the same for a process that ends on its own (an error, a failed write): the others
would otherwise wait in their next barrier until they are killed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

FAILURE_KEY = "xrun/ckpt/failed"
EXIT_KEY = "xrun/exit"  # "<process id> <exit code> <reason>": the first to end on its own
# A watch's long poll: one RPC a second to the coordination service per process and key, and
# the longest a thread that stops it may wait for it to notice (join it before exiting).
POLL_S = 1.0


def exit_notice(message: str) -> tuple[str, str, str]:
    """(process id, exit code, reason) of EXIT_KEY's value, as ``Peers.publish_exit`` wrote it."""
    process, code, reason = (message.split(" ", 2) + ["", ""])[:3]
    return process, code, reason


class Peers:
    """Rounds of agreement; a single process agrees with itself without any RPC."""

    def __init__(self, prefix: str = "xrun/ckpt/round", timeout_s: float = 600.0):
        import jax

        self.count = jax.process_count()
        self.process_id = jax.process_index()
        self.prefix = prefix
        self.timeout_ms = int(timeout_s * 1000)
        self.client = None
        if self.count > 1:
            from workload.private_seam import distributed_state

            self.client = distributed_state().client
            if self.client is None:
                raise RuntimeError("several JAX processes but no distributed client")
        self.rounds = 0

    def gather(self, value: str) -> list[str]:
        """Every process's ``value`` for this round, by process id. All processes must call it
        the same number of times (the round number is the rendezvous)."""
        if self.client is None:
            return [value]
        self.rounds += 1
        base = f"{self.prefix}/{self.rounds}"
        self.client.key_value_set(f"{base}/{self.process_id}", value)
        self.client.wait_at_barrier(f"{base}/barrier", self.timeout_ms)
        values: dict[int, str] = {}
        for key, v in self.client.key_value_dir_get(f"{base}/"):
            last = key.rstrip("/").rsplit("/", 1)[-1]
            if last.isdigit():
                values[int(last)] = v
        if self.rounds > 1:  # everyone read the previous round before this barrier
            self.client.key_value_delete(f"{self.prefix}/{self.rounds - 1}/{self.process_id}")
        missing = [p for p in range(self.count) if p not in values]
        if missing:
            raise RuntimeError(f"agreement round {self.rounds}: no value from processes {missing}")
        return [values[p] for p in range(self.count)]

    def publish_failure(self, message: str) -> None:
        """Tell every process (their ``watch``) that a checkpoint write failed; idempotent."""
        if self.client is None:
            return
        # Already set by another process: the first failure is the one reported.
        with contextlib.suppress(Exception):
            self.client.key_value_set(FAILURE_KEY, message, allow_overwrite=False)

    def publish_exit(self, code: int, reason: str) -> None:
        """This process ends without its peers: tell them (their ``watch`` of EXIT_KEY), so
        that none waits for it in a collective or a barrier it will never join; idempotent."""
        if self.client is None:
            return
        with contextlib.suppress(Exception):  # already set: the first one is the cause
            self.client.key_value_set(EXIT_KEY, f"{self.process_id} {code} {reason}",
                                      allow_overwrite=False)

    def failure(self) -> str | None:
        if self.client is None:
            return None
        try:
            return self.client.key_value_try_get(FAILURE_KEY)
        except Exception:  # noqa: BLE001 - NOT_FOUND
            return None

    def watch(self, on_failure: Callable[[str], None], stop: threading.Event, key: str = FAILURE_KEY,
              name: str = "xrun-ckpt-watch") -> threading.Thread | None:
        """A daemon thread long-polling ``key`` (the failure flag); calls ``on_failure(message)``
        once."""
        if self.client is None:
            return None

        def loop() -> None:
            while not stop.is_set():
                try:
                    message = self.client.blocking_key_value_get(key, int(POLL_S * 1000))  # type: ignore[union-attr]
                except Exception:  # noqa: BLE001 - DEADLINE_EXCEEDED: not set yet
                    continue
                if not stop.is_set():
                    on_failure(message)
                return

        thread = threading.Thread(target=loop, name=name, daemon=True)
        thread.start()
        return thread
