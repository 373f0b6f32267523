"""``celery.utils.graph``: the dependency graph ``AsyncResult.build_graph`` returns.

A graph maps each object to the objects it depends on (``add_edge(A, B)``: ``A`` depends
on ``B``, Celery's reading; for a result graph a parent "depends" on its children).
``topsort`` gives an order in which every object comes after what it depends on;
``to_dot`` writes Graphviz text.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import IO, Any

__all__ = ["CycleError", "DependencyGraph", "GraphFormatter"]


class CycleError(Exception):
    """The graph has a cycle (``topsort`` cannot order it)."""


class GraphFormatter:
    """How ``DependencyGraph.to_dot`` draws nodes and edges (``root``: the node drawn as
    the graph's root; ``shape``: the nodes' shape)."""

    def __init__(self, root: Any = None, type: str | None = None, id: str | None = None,
                 indent: int = 0, inw: str = " " * 4, shape: str = "box", **scheme: Any
                 ) -> None:
        self.root = root
        self.type = type or "digraph"
        self.id = id or "dependencies"
        self.indent, self.inw = indent, inw
        self.shape = shape
        self.scheme = scheme

    def label(self, obj: Any) -> str:
        """The text drawn for ``obj``."""
        return str(obj)

    def _attrs(self, attrs: dict[str, Any]) -> str:
        merged = {"shape": self.shape, **self.scheme, **attrs}
        return ", ".join(f'{key}="{value}"' for key, value in merged.items())

    def head(self) -> str:
        """The graph's first line."""
        return f"{self.type} {self.id} {{"

    def tail(self) -> str:
        """The graph's last line."""
        return "}"

    def node(self, obj: Any, **attrs: Any) -> str:
        """A node's line (the root's is drawn with ``style=filled``)."""
        if self.root is not None and self.label(obj) == str(self.root):
            attrs = {"style": "filled", **attrs}
        return f'{self.inw}"{self.label(obj)}" [{self._attrs(attrs)}]'

    def edge(self, a: Any, b: Any) -> str:
        """An edge's line."""
        return f'{self.inw}"{self.label(a)}" -> "{self.label(b)}"'


class DependencyGraph:
    """Objects and what each depends on; ``it``: ``(obj, dependencies)`` pairs."""

    def __init__(self, it: Iterable[tuple[Hashable, Iterable[Hashable]]] | None = None,
                 formatter: GraphFormatter | None = None) -> None:
        self.formatter = formatter or GraphFormatter()
        self.adjacent: dict[Any, list[Any]] = {}
        if it is not None:
            self.update(it)

    def add_arc(self, obj: Hashable) -> None:
        """Add ``obj`` (depending on nothing yet)."""
        self.adjacent.setdefault(obj, [])

    def add_edge(self, A: Hashable, B: Hashable) -> None:
        """``A`` depends on ``B`` (``A`` must be in the graph already)."""
        self.adjacent[A].append(B)

    def connect(self, graph: DependencyGraph) -> None:
        """Add the objects of another graph (theirs replace ours)."""
        self.adjacent.update(graph.adjacent)

    def update(self, it: Iterable[tuple[Hashable, Iterable[Hashable]]]) -> None:
        """Add ``(obj, dependencies)`` pairs."""
        pairs = [(obj, list(deps)) for obj, deps in it]
        for obj, _ in pairs:
            self.add_arc(obj)
        for obj, deps in pairs:
            for dep in deps:
                self.add_edge(obj, dep)

    def edges(self) -> Iterator[Any]:
        """The objects that depend on something (Celery's meaning of ``edges``)."""
        return (obj for obj, deps in self.adjacent.items() if deps)

    def valency_of(self, obj: Hashable) -> int:
        """How many dependencies ``obj`` has, counted down through theirs."""
        deps = self.adjacent.get(obj)
        if deps is None:
            return 0
        return len(deps) + sum(self.valency_of(dep) for dep in deps)

    def topsort(self) -> list[Any]:
        """Every object after the objects it depends on; ``CycleError`` on a cycle."""
        done: set[Any] = set()
        active: set[Any] = set()
        order: list[Any] = []

        def visit(obj: Any) -> None:
            # Iterative post-order: a result graph may be a 1,000-step chain deep.
            stack = [(obj, iter(self.adjacent.get(obj, ())))]
            active.add(obj)
            while stack:
                node, deps = stack[-1]
                for dep in deps:
                    if dep in active:
                        raise CycleError(f"cycle through {dep!r}")
                    if dep not in done:
                        active.add(dep)
                        stack.append((dep, iter(self.adjacent.get(dep, ()))))
                        break
                else:
                    stack.pop()
                    active.discard(node)
                    done.add(node)
                    order.append(node)

        for obj in self.adjacent:
            if obj not in done:
                visit(obj)
        return order

    def format(self, obj: Any) -> str:
        """``obj`` as the formatter labels it."""
        return self.formatter.label(obj)

    def to_dot(self, fh: IO[str], formatter: GraphFormatter | None = None) -> None:
        """Write the graph as Graphviz text to ``fh``."""
        shown = formatter or self.formatter
        lines = [shown.head()]
        lines += [shown.node(obj) for obj in self.adjacent]
        lines += [shown.edge(obj, dep) for obj, deps in self.adjacent.items() for dep in deps]
        lines.append(shown.tail())
        fh.write("\n".join(lines) + "\n")

    def items(self) -> Iterator[tuple[Any, list[Any]]]:
        """``(obj, dependencies)`` pairs."""
        return iter(self.adjacent.items())

    iteritems = items

    def __iter__(self) -> Iterator[Any]:
        return iter(self.adjacent)

    def __getitem__(self, node: Hashable) -> list[Any]:
        return self.adjacent[node]

    def __len__(self) -> int:
        return len(self.adjacent)

    def __contains__(self, obj: object) -> bool:
        return obj in self.adjacent

    def __repr__(self) -> str:
        return "\n".join(f"{obj}({', '.join(map(str, deps))})" if deps else str(obj)
                         for obj, deps in self.adjacent.items())
