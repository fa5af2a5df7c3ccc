"""The layout's rules, checked: orchestrator and manifests never import jax; workload never
imports kubernetes; the contract imports neither side."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

from cli_helpers import REPO


def imported_after(modules: list[str]) -> set[str]:
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120, check=True).stdout
    return {m.split(".")[0] for m in out.split()}


def modules_of(package: str) -> list[str]:
    path = REPO / package
    return [package] + [f"{package}.{m.name}" for m in pkgutil.walk_packages([str(path)])]


def test_orchestrator_and_manifests_never_import_jax():
    loaded = imported_after(modules_of("orchestrator") + ["orchestrator.backends.local",
                                                          "orchestrator.backends.kube"]
                            + modules_of("manifests"))
    assert not loaded & {"jax", "jaxlib", "flax", "optax", "orbax", "numpy"}


def test_workload_never_imports_kubernetes():
    loaded = imported_after(modules_of("workload"))
    assert "jax" in loaded  # the check is real: the workload modules did load
    assert not loaded & {"kubernetes", "orchestrator", "manifests"}


def test_contract_imports_neither_side():
    loaded = imported_after(["xrun_contract", "xrun_contract.storage"])
    assert not loaded & {"jax", "kubernetes", "orchestrator", "manifests", "workload"}
