"""atlas_core's top-level packages and modules import each other without cycles.

Every import statement counts, wherever it is (module level, inside a function, under
``TYPE_CHECKING``): a cycle of deferred imports is still a cycle in the design.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import atlas_core

ROOT = Path(atlas_core.__file__).parent
PACKAGE = ROOT.name


def module_name(path: Path) -> str:
    """``atlas_core/engine/llm.py`` -> ``atlas_core.engine.llm`` (a package is its ``__init__``'s name)."""
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit(module: str) -> str:
    """The top-level package or module of ``atlas_core`` that ``module`` belongs to (``atlas_core``
    itself for the root package's own names)."""
    parts = module.split(".")
    if len(parts) == 1:
        return PACKAGE
    top = parts[1]
    return top if (ROOT / top).is_dir() or (ROOT / f"{top}.py").is_file() else PACKAGE


def imported_modules(source: str, module: str, is_package: bool) -> Iterator[str]:
    """Every module that the code ``source`` of ``module`` imports (``from X import name`` yields
    ``X.name`` when that is an atlas_core module, else ``X``; relative imports are resolved)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield candidate if _is_module(candidate) else base


def _is_module(dotted: str) -> bool:
    relative = Path(*dotted.split(".")[1:]) if dotted.startswith(f"{PACKAGE}.") else None
    return relative is not None and ((ROOT / relative).is_dir() or (ROOT / relative).with_suffix(".py").is_file())


def package_graph() -> dict[str, dict[str, str]]:
    """unit -> {imported unit: one file (relative to the repository) that makes that edge}."""
    graph: dict[str, dict[str, str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        source = unit(module_name(path))
        edges = graph.setdefault(source, {})
        code = path.read_text(encoding="utf-8")
        for module in imported_modules(code, module_name(path), path.name == "__init__.py"):
            if module == PACKAGE or module.startswith(f"{PACKAGE}."):
                target = unit(module)
                if target != source:
                    edges.setdefault(target, str(path.relative_to(ROOT.parent)))
    return graph


def find_cycle(graph: dict[str, dict[str, str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or None when the graph is acyclic (depth-first search)."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, {})):
            if state.get(target) == "open":
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, str]]) -> str:
    steps = [f"  {a} -> {b}   (e.g. {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False)]
    return "import cycle between atlas_core packages: " + " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_core_packages_form_no_cycle() -> None:
    graph = package_graph()
    assert {"engine", "model", "batch", "parsing", "cli", "bench", "server", "options"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, describe(cycle, graph)


def test_the_layering_named_in_the_architecture() -> None:
    """Model code sits below the engine, grammars below the engine, the CLI above bench."""
    graph = package_graph()
    for lower, upper in [
        ("model", "engine"),
        ("batch", "engine"),
        ("batch", "model"),
        ("parsing", "engine"),
        ("bench", "cli"),
        ("options", "engine"),
    ]:
        assert upper not in graph[lower], f"{lower} imports {upper} ({graph[lower][upper]})"


def test_a_cycle_is_found_and_named() -> None:
    graph = {"a": {"b": "a.py"}, "b": {"c": "b.py"}, "c": {"a": "c.py"}, "d": {"a": "d.py"}}
    cycle = find_cycle(graph)
    assert cycle == ["a", "b", "c", "a"]
    assert describe(cycle, graph).startswith("import cycle between atlas_core packages: a -> b -> c -> a")
    assert find_cycle({"a": {"b": "a.py"}, "b": {}}) is None


def test_relative_and_root_imports_resolve() -> None:
    source = "from . import errors\nfrom ..engine import llm\nfrom atlas_core import LLM\nimport atlas_core.cli\n"
    modules = list(imported_modules(source, "atlas_core.server.app", is_package=False))
    assert modules == ["atlas_core.server.errors", "atlas_core.engine.llm", "atlas_core", "atlas_core.cli"]
    assert [unit(m) for m in modules] == ["server", "engine", PACKAGE, "cli"]
