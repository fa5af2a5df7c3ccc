"""The contract between the orchestrator/manifests side and the workload side.

Both sides import this package and nothing of each other. It names every env var the
manifest sets and the workload reads (``env``), the storage layout and the run states
(``layout``), the log line formats and their readers (``lines``) and the metrics record
schema (``records``). Change a name here or nowhere. It depends on neither jax nor
kubernetes (the storage helpers in ``xrun_contract.storage`` need only the GCS client).

Every public name of the three modules is re-exported, so ``from xrun_contract import X``
reads any of them.
"""

from __future__ import annotations

from xrun_contract import records as records
from xrun_contract.env import *  # noqa: F403
from xrun_contract.layout import *  # noqa: F403
from xrun_contract.lines import *  # noqa: F403
