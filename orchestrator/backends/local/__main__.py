"""``python -m orchestrator.backends.local supervise STORAGE_ROOT NAME``: the supervisor."""

import sys

from orchestrator.backends.local.supervisor import main

sys.exit(main(sys.argv[1:]))
