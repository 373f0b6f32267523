"""Print the import circles among akadze_core's modules, TYPE_CHECKING imports included.

``python -m bench.import_cycles`` lists each strongly connected component of more than
one module (a circle), then the biggest modules by lines: a circle kept alive only by a
TYPE_CHECKING import is still two modules that cannot be read apart.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "akadze_core"


def graph(root: Path) -> dict[str, set[str]]:
    """Module name -> the package's modules it imports (at run time or for type checks)."""
    modules = {path.stem: path for path in root.glob("*.py")}
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1:
                    targets = [node.module] if node.module else [a.name for a in node.names]
                elif node.module and node.module.startswith(PACKAGE + "."):
                    targets = [node.module.split(".")[1]]
                elif node.module == PACKAGE:
                    targets = [alias.name for alias in node.names]
                else:
                    continue
                edges[name].update(t.split(".")[0] for t in targets
                                   if t.split(".")[0] in modules and t != name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in modules:
                        edges[name].add(parts[1])
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
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

    sys.setrecursionlimit(10_000)
    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def main() -> int:
    root = Path(__file__).resolve().parent.parent / PACKAGE
    edges = graph(root)
    found = circles(edges)
    print(f"{len(found)} circles in {PACKAGE} (TYPE_CHECKING imports counted)")
    for component in found:
        print(f"  {len(component)} modules: {', '.join(component)}")
    sizes = sorted(((len(path.read_text().splitlines()), path.stem)
                    for path in root.glob("*.py")), reverse=True)[:5]
    print("biggest modules: " + ", ".join(f"{name} {lines}" for lines, name in sizes))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
