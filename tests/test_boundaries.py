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


# ---------------------------------------------------------------------------------------
# The layers inside the orchestrator (docs/ARCHITECTURE.md), read from the source: every
# import statement, top-level or inside a function, counts.

def imports_of(package: str) -> dict[str, set[str]]:
    """module -> the modules it imports (absolute names), for every module of ``package``."""
    import ast

    out: dict[str, set[str]] = {}
    for path in (REPO / package.replace(".", "/")).rglob("*.py"):
        rel = path.relative_to(REPO).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names |= {f"{node.module}.{a.name}" for a in node.names}
        out[module] = names
    return out


def reaches(names: set[str], prefix: str) -> bool:
    return any(n == prefix or n.startswith(prefix + ".") for n in names)


def test_services_never_import_the_cli_and_the_cli_goes_through_services():
    graph = imports_of("orchestrator")
    below_cli = [m for m in graph if not m.startswith("orchestrator.cli")]
    assert below_cli and not [m for m in below_cli if reaches(graph[m], "orchestrator.cli")]
    commands = [m for m in graph if m in ("orchestrator.cli.runs", "orchestrator.cli.analysis",
                                          "orchestrator.cli.cluster")]
    assert len(commands) == 3
    for m in commands:
        assert reaches(graph[m], "orchestrator.services"), f"{m} must call services"
        assert not reaches(graph[m], "orchestrator.backends"), f"{m} must not drive a backend itself"


def test_lower_layers_never_import_upper_ones():
    graph = imports_of("orchestrator")
    rules = {  # layer -> what it must never import
        "orchestrator.backends": ("orchestrator.services", "orchestrator.cli", "orchestrator.readers",
                                  "orchestrator.analysis"),
        "orchestrator.readers": ("orchestrator.services", "orchestrator.cli"),
        "orchestrator.analysis": ("orchestrator.services", "orchestrator.cli", "orchestrator.backends"),
    }
    for module, names in graph.items():
        for layer, banned in rules.items():
            if module.startswith(layer):
                hit = [b for b in banned if reaches(names, b)]
                assert not hit, f"{module} imports {hit}"
    for module, names in imports_of("manifests").items():
        assert not reaches(names, "orchestrator") and not reaches(names, "workload"), module
