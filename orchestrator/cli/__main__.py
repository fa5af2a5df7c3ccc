"""``python -m orchestrator.cli``: the same as the ``xrun`` command."""

import sys

from orchestrator.cli import main

sys.exit(main())
