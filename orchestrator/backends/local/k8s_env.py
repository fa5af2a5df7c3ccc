"""Kubernetes' $(VAR) expansion, reproduced for the local backend.

In a container's command, args and env values Kubernetes replaces ``$(NAME)`` by the value
of an earlier-defined env var, reduces ``$$`` to ``$``, and leaves unresolvable references
as written. The local backend applies the same rule so a manifest that would be wrong on a
cluster is wrong locally too.
"""

from __future__ import annotations

import re

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _REF.sub(sub, text)
