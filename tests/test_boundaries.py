"""The layout's rules, checked: orchestrator and manifests never import jax; workload never
imports kubernetes; the contract imports neither side."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

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
    commands = [m for m in graph if m in ("orchestrator.cli.runs", "orchestrator.cli.logs",
                                          "orchestrator.cli.analysis", "orchestrator.cli.cluster")]
    assert len(commands) == 4
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


# ---------------------------------------------------------------------------------------
# No import cycle among the product packages, read from the source: every import statement
# counts, top-level or inside a function (a lazy import hides a cycle, it does not remove
# it); only ``if TYPE_CHECKING:`` blocks, which never run, are left out.

PRODUCT = ("xrun_contract", "manifests", "orchestrator", "workload")
# Cycles another change removes (name it); each entry must still be a cycle, so a fixed one
# is struck off here at once.
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def product_modules() -> dict[str, Path]:
    out = {}
    for package in PRODUCT:
        for path in (REPO / package).rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            out[".".join(rel.parts).removesuffix(".__init__")] = path
    return out


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the product modules it imports (``from p import m`` names module p.m when
    there is one, else p itself)."""
    modules = product_modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    targets.add(full if full in modules else base)
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    source = "def f():\n    from pkg import b\n"
    nodes = _runtime_nodes(ast.parse(source))
    assert any(isinstance(n, ast.ImportFrom) for n in nodes)
    hidden = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n"
    assert not [n for n in _runtime_nodes(ast.parse(hidden)) if isinstance(n, ast.Import)]


def test_no_import_cycle_among_the_product_packages():
    graph = import_graph()
    assert len(graph) > 90 and "orchestrator.readers.logparse" in graph
    assert "xrun_contract.storage_base" in graph["xrun_contract.gcs_http"]  # edges are real
    found = {frozenset(c): c for c in cycles(graph)}
    stale = [sorted(c) for c in KNOWN_CYCLES if c not in found]
    assert not stale, f"no longer cycles: strike them off KNOWN_CYCLES: {stale}"
    new = [c for key, c in found.items() if key not in KNOWN_CYCLES]
    assert not new, "import cycles (function-level imports count): " + "; ".join(
        " <-> ".join(c) for c in new)


def test_readers_never_import_analysis():
    graph = import_graph()
    readers = [m for m in graph if m.startswith("orchestrator.readers")]
    assert len(readers) >= 8
    for module in readers:
        hit = [t for t in graph[module] if t.startswith("orchestrator.analysis")]
        assert not hit, f"{module} imports {hit}: readers never import analysis"
