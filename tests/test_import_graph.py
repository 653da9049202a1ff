"""The package's imports form no circle, deferred imports included, and point down the layers.

The graph is built from the source with ``ast``: every ``import`` and
``from ... import`` anywhere in a module (at the top, inside functions, under
``TYPE_CHECKING``) is an edge to the fedweigh module it names. ``from pkg
import name`` depends on ``pkg.name`` when that is a module, else on ``pkg``.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "fedweigh"

# Lower layers may not import upper ones (docs/design.md).
LAYERS: list[set[str]] = [
    {
        "fedweigh.settings",
        "fedweigh.options",
        "fedweigh.protocol",
        "fedweigh.arrays",
        "fedweigh.faults",
        "fedweigh.flower",  # Flower changes: Flower, the standard library, and (the engine) settings
        "fedweigh.allocator",
        "fedweigh.methods.catalog",  # the methods' options, signals and step names, gathered from:
        "fedweigh.methods.*.protocol",
        "fedweigh.methods.costs",
    },
    {
        "fedweigh.data",
        "fedweigh.models",
        "fedweigh.rules",
        "fedweigh.client",
        "fedweigh.results",
        "fedweigh.run_folder",
        "fedweigh.tracking",
        "fedweigh.methods.*.client",
    },
    {"fedweigh.methods", "fedweigh.components", "fedweigh.strategies", "fedweigh.preflight", "fedweigh.flops"},
    {"fedweigh.server_app", "fedweigh.client_app", "fedweigh.launch"},
    {"fedweigh.experiments", "fedweigh.benchmarks", "fedweigh.cli"},
]


def module_files() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def imported(module: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Every fedweigh module ``module`` imports, wherever the import statement stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and _gathers(node):  # a method package's modules, found at run time
            part = node.args[0].value
            yield from (name for name in modules if fnmatch.fnmatchcase(name, f"fedweigh.methods.*.{part}"))
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        yield from (target for target in targets if target in modules and target != module)


def _gathers(node: ast.Call) -> bool:
    """``gather("server", ...)`` or ``package_modules("client")``: :mod:`fedweigh.methods.catalog` importing
    every method package's module of that name; the graph holds those imports as edges."""
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    first = node.args[0] if node.args else None
    return name in ("gather", "package_modules") and isinstance(first, ast.Constant) and isinstance(first.value, str)


@functools.cache
def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: set(imported(name, path, modules)) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), and self-imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


EXACT = {"fedweigh.methods": 0}
"""Packages whose ``__init__`` alone has a layer (the methods' imports nothing, below its own modules)."""


def layer_of(module: str) -> int | None:
    if module in EXACT:
        return EXACT[module]
    for level, members in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, member) or fnmatch.fnmatchcase(module, member + ".*") for member in members):
            return level
    return None


def test_the_package_has_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_deferred_imports():
    # the graph of the real package holds an import made inside a function (the CLI's preflight)
    assert "fedweigh.preflight" in import_graph()["fedweigh.cli"]


@pytest.mark.parametrize("module", sorted(module_files()))
def test_every_module_has_a_layer_and_imports_only_downwards(module):
    level = layer_of(module)
    if module == "fedweigh":
        return
    assert level is not None, f"{module} is in no layer of docs/design.md"
    upward = sorted(target for target in import_graph()[module] if (layer_of(target) or 0) > level)
    assert upward == [], f"{module} (layer {level}) imports upwards: {upward}"


def reached_from(*modules: str) -> set[str]:
    """Every fedweigh module that importing ``modules`` can import, deferred imports included."""
    graph = import_graph()
    reached, frontier = set(), list(modules)
    while frontier:
        module = frontier.pop()
        for target in graph[module] - reached:
            reached.add(target)
            frontier.append(target)
    return reached


RUNTIME = ("fedweigh.server_app", "fedweigh.client_app", "fedweigh.strategies.library", "fedweigh.client")
"""What a running app imports: fedweigh's own apps, and the library a user's ServerApp and ClientApp use."""
TOOLS = ("fedweigh.launch", "fedweigh.experiments", "fedweigh.benchmarks", "fedweigh.cli")
"""The launchers, the experiment runner, the benchmarks and their harnesses (the network-namespace federation)."""


def is_tool(module: str) -> bool:
    return any(module == tool or module.startswith(tool + ".") for tool in TOOLS)


def test_no_tool_or_harness_is_on_a_running_app_s_path():
    assert is_tool("fedweigh.launch.virtual_federation") and is_tool("fedweigh.cli") and not is_tool("fedweigh.client")
    assert sorted(m for m in reached_from(*RUNTIME) if is_tool(m)) == []


def is_server_code(module: str) -> bool:
    """The strategies, rules, tracking and a method's server half (its package, protocol and client are shared)."""
    if module.startswith("fedweigh.methods"):
        return not re.fullmatch(r"fedweigh\.methods(\.catalog|\.\w+(\.protocol|\.client)?)?", module)
    return module.startswith(("fedweigh.strategies", "fedweigh.rules", "fedweigh.tracking"))


def test_the_graph_sees_the_method_packages_found_at_run_time():
    graph = import_graph()
    assert {"fedweigh.methods.fedoui.protocol", "fedweigh.methods.ufl.protocol"} <= graph["fedweigh.methods.catalog"]
    assert "fedweigh.methods.flood.server" in graph["fedweigh.methods.registry"]
    assert "fedweigh.methods.flood.client" in graph["fedweigh.client.registry"]


def test_the_client_app_imports_no_server_code():
    # tracking (TensorBoard, MLflow) is the ServerApp's alone: no client imports it, even deferred
    assert is_server_code("fedweigh.methods.fedoui.server") and not is_server_code("fedweigh.methods.fedoui.client")
    assert sorted(m for m in reached_from("fedweigh.client_app") if is_server_code(m)) == []


def test_a_client_app_process_loads_no_server_code():
    # what the ClientApp module really imports, method packages found at run time included
    code = "import sys, fedweigh.client_app; print(' '.join(m for m in sys.modules if m.startswith('fedweigh')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    modules = loaded.stdout.split()
    assert "fedweigh.methods.fedoui.client" in modules
    assert sorted(m for m in modules if is_server_code(m)) == []
