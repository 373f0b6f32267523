"""How akadze_compat's modules depend on each other, read from the source with ``ast``.

``python -m tests.package_structure`` prints the numbers the layering is judged by
(``--json`` for a machine); ``tests/unit/test_layers.py`` checks the layers with the same scan.

- **modules in import cycles**: the modules in a strongly connected component of more than
  one module of the module-level import graph (imports under ``if TYPE_CHECKING:`` and inside
  functions are not edges: they do not run when the module is imported); counted again with
  the imports inside functions as edges (the cycles they dodge), and with the type checker's.
- **function-level self-imports**: ``import``/``from ... import`` statements of the package's
  own modules inside a function (a cycle dodged at import time is still a cycle).
- **cross-module private accesses**: ``obj._x`` where ``obj`` is not ``self``/``cls`` and
  ``_x`` is a private attribute defined by a class of *another* module of the package (a
  method ``def _x``, a class-level ``_x = ...``, or ``self._x = ...`` in a method). The owner
  is found by name only (no types are inferred), so a name defined by a class of this module
  too is not counted, and a name defined only outside the package (``sys._getframe``) is not.
- **cross-module private imports**: ``from .x import _y`` of a private module-level name.
"""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "akadze_compat"
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Import:
    """One import statement's target module in the package."""

    source: str
    target: str
    line: int
    in_function: bool
    type_checking: bool
    names: tuple[str, ...] = ()


@dataclass
class Module:
    """A module of the package: its name, file, tree and the private names its classes own."""

    name: str
    path: Path
    tree: ast.Module
    is_package: bool
    imports: list[Import] = field(default_factory=list)
    private_attributes: set[str] = field(default_factory=set)


def module_name(path: Path, root: Path) -> str:
    """``akadze_compat/app/base.py`` -> ``akadze_compat.app.base``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Module]:
    """Every module of ``package`` under ``root``, parsed and scanned."""
    modules: dict[str, Module] = {}
    for path in sorted((root / package).rglob("*.py")):
        name = module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        modules[name] = Module(name, path, tree, path.name == "__init__.py")
    for module in modules.values():
        module.imports = list(_imports(module, modules, package))
        module.private_attributes = _private_attributes(module.tree)
    return modules


def _resolve(module: Module, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.name.split(".")
    if not module.is_package:
        base.pop()
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(node: ast.AST, in_function: bool = False,
          type_checking: bool = False) -> Iterator[tuple[ast.AST, bool, bool]]:
    for child in ast.iter_child_nodes(node):
        yield child, in_function, type_checking
        inner_function = in_function or isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for statement in child.body:
                yield statement, inner_function, True
                yield from _walk(statement, inner_function, True)
            for statement in child.orelse:
                yield statement, inner_function, type_checking
                yield from _walk(statement, inner_function, type_checking)
            continue
        yield from _walk(child, inner_function, type_checking)


def _imports(module: Module, modules: dict[str, Module], package: str) -> Iterator[Import]:
    for node, in_function, type_checking in _walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    yield Import(module.name, _known(alias.name, modules), node.lineno,
                                 in_function, type_checking)
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node.level, node.module)
            if not (target == package or target.startswith(package + ".")):
                continue
            names = tuple(alias.name for alias in node.names)
            submodules = [f"{target}.{name}" for name in names if f"{target}.{name}" in modules]
            # ``from . import x`` of a submodule is an edge to it; any other name is one to
            # the module it comes from (``from .app import Celery``).
            if len(submodules) < len(names) or not submodules:
                yield Import(module.name, _known(target, modules), node.lineno, in_function,
                             type_checking, tuple(n for n in names
                                                  if f"{target}.{n}" not in modules))
            for submodule in submodules:
                yield Import(module.name, submodule, node.lineno, in_function, type_checking)


def _known(name: str, modules: dict[str, Module]) -> str:
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_attributes(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(node.name):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and _private(target.id):
                        names.add(target.id)
                    elif (isinstance(target, ast.Attribute) and _private(target.attr)
                          and isinstance(target.value, ast.Name)
                          and target.value.id in ("self", "cls")):
                        names.add(target.attr)
    return names


def module_graph(modules: dict[str, Module], in_functions: bool = False,
                 type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports when it is imported; with ``in_functions``
    also those its functions import when called, with ``type_checking`` also those only the
    type checker reads."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for module in modules.values():
        for item in module.imports:
            if item.target == module.name:
                continue
            if (item.in_function and not in_functions) or (
                    item.type_checking and not type_checking):
                continue
            graph[module.name].add(item.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
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

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def function_imports(modules: dict[str, Module]) -> list[Import]:
    """Imports of the package's own modules inside functions."""
    return [item for module in modules.values() for item in module.imports
            if item.in_function]


def private_accesses(modules: dict[str, Module]) -> list[tuple[str, int, str]]:
    """``(module, line, "obj._x")`` for every access to another module's class's private
    attribute (see the module docstring for how the owner is guessed)."""
    owners: dict[str, set[str]] = {}
    for module in modules.values():
        for name in module.private_attributes:
            owners.setdefault(name, set()).add(module.name)
    found = []
    for module in modules.values():
        for node in ast.walk(module.tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            owning = owners.get(node.attr, set())
            if owning and module.name not in owning:
                found.append((module.name, node.lineno, f"{ast.unparse(node.value)}.{node.attr}"))
    return sorted(found)


def private_imports(modules: dict[str, Module]) -> list[Import]:
    """``from .x import _y`` of a private name of another module of the package."""
    return [item for module in modules.values() for item in module.imports
            if any(_private(name) for name in item.names)]


#: The engine the facade is built on, and the one core module beyond its public names that
#: the facade may import (see ``akadze_core.integration``).
CORE = "akadze_core"
CORE_INTEGRATION = CORE + ".integration"


def core_imports(modules: dict[str, Module], root: Path = ROOT,
                 core: str = CORE) -> list[Import]:
    """Every import of ``core`` in the package, wherever it is (inside functions and under
    ``if TYPE_CHECKING:`` too): its target is the core module imported, so
    ``from akadze_core import database`` (a submodule) is an import of
    ``akadze_core.database``, ``from akadze_core import App`` one of ``akadze_core``."""
    def is_submodule(name: str) -> bool:
        path = root / Path(*name.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    found: list[Import] = []
    for module in modules.values():
        for node, in_function, type_checking in _walk(module.tree):
            if isinstance(node, ast.Import):
                found.extend(Import(module.name, alias.name, node.lineno, in_function,
                                    type_checking)
                             for alias in node.names
                             if alias.name == core or alias.name.startswith(core + "."))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module == core or node.module.startswith(core + ".")):
                names = tuple(alias.name for alias in node.names)
                submodules = [f"{node.module}.{n}" for n in names
                              if is_submodule(f"{node.module}.{n}")]
                if len(submodules) < len(names):
                    found.append(Import(module.name, node.module, node.lineno, in_function,
                                        type_checking, names))
                found.extend(Import(module.name, submodule, node.lineno, in_function,
                                    type_checking) for submodule in submodules)
    return found


def summary(root: Path = ROOT) -> dict[str, object]:
    """The numbers, and the places behind them."""
    modules = load(root)
    components = cycles(module_graph(modules))
    runtime = cycles(module_graph(modules, in_functions=True))
    static = cycles(module_graph(modules, in_functions=True, type_checking=True))
    return {
        "modules": len(modules),
        "modules_in_cycles": sum(len(component) for component in components),
        "modules_in_cycles_counting_function_imports": sum(len(c) for c in runtime),
        "modules_in_cycles_counting_type_checking_imports": sum(len(c) for c in static),
        "cycles": components,
        "cycles_counting_function_imports": runtime,
        "function_level_self_imports": len(function_imports(modules)),
        "function_imports": [f"{i.source}:{i.line} -> {i.target}"
                             for i in function_imports(modules)],
        "cross_module_private_accesses": len(private_accesses(modules)),
        "private_accesses": [f"{m}:{line} {text}" for m, line, text in private_accesses(modules)],
        "cross_module_private_imports": len(private_imports(modules)),
        "private_imports": [f"{i.source}:{i.line} {', '.join(i.names)} from {i.target}"
                            for i in private_imports(modules)],
        "core_submodules_imported": len(core_submodules := sorted(
            {i.target for i in core_imports(modules, root)} - {CORE})),
        "core_submodules": core_submodules,
    }


def main(argv: list[str]) -> None:
    """Print the summary: counts first, then the places (``--json``: all as JSON)."""
    result = summary(Path(argv[argv.index("--root") + 1]) if "--root" in argv else ROOT)
    if "--json" in argv:
        print(json.dumps(result, indent=2))
        return
    for key, value in result.items():
        if isinstance(value, int):
            print(f"{key}: {value}")
    for key, value in result.items():
        if isinstance(value, list) and value:
            print(f"\n{key}:")
            for item in value:
                print(f"  {item}")


if __name__ == "__main__":
    main(sys.argv[1:])
