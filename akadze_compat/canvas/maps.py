"""``task.map(it)``, ``task.starmap(it)`` and ``task.chunks(it, n)`` (Celery's ``xmap``,
``xstarmap`` and ``chunks``): a map is one task (the built-in ``celery.map`` or
``celery.starmap``) calling another task's body for each item, in order, in the worker;
chunks are a group of starmaps, one per part of ``n`` items.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from .primitives import group
from .signatures import FlowBuilder, Planned, Signature, maybe_signature

__all__ = ["chunks", "xmap", "xstarmap"]


class _basemap(Signature):
    """``task.map(it)`` / ``task.starmap(it)``: one task that calls ``task`` for each item
    in the worker, in order (not in parallel: use a group or ``chunks`` for that)."""

    task_name = "celery.map"

    @classmethod
    def from_dict(cls, data: Any, app: Any = None) -> Signature:
        """A map from its dict form."""
        kwargs = data["kwargs"]
        return cls(kwargs["task"], kwargs["it"], app=app, **dict(data.get("options") or {}))

    def __init__(self, task: Any, it: Iterable[Any], **options: Any) -> None:
        app = options.pop("app", None)
        super().__init__(self.task_name, (), {"task": task, "it": list(it)}, immutable=True,
                         app=app, **options)

    def _sent(self) -> Signature:
        """The plain signature of the built-in task that runs the map."""
        task = maybe_signature(self.kwargs["task"], app=self._app)
        return Signature(self.task_name, (), {"task": dict(task), "it": list(self.kwargs["it"])},
                         dict(self.options), immutable=True, app=self._app)

    def to_flow(self, builder: FlowBuilder, args: Any = None, kwargs: Any = None, *,
                after: list[Any], many: bool, failure: str,
                options: Any = None) -> Planned:
        """One node: the built-in map task."""
        return self._sent().to_flow(builder, args, kwargs, after=after, many=many,
                                    failure=failure, options=options)

    def apply_async(self, args: Any = None, kwargs: Any = None,  # type: ignore[override]
                    **options: Any) -> Any:
        """Send the built-in task that runs the map."""
        return self._sent().apply_async(**options)

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run the map here."""
        return self._sent().apply(**options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.apply_async()


@Signature.register_type()
class xmap(_basemap):
    """``task.map(it)``: ``[task(item) for item in it]`` in one task."""

    task_name = "celery.map"

    def __repr__(self) -> str:
        task = maybe_signature(self.kwargs["task"])
        return f"[{task.task}(x) for x in {repr(self.kwargs['it'])[:100]}]"


@Signature.register_type()
class xstarmap(_basemap):
    """``task.starmap(it)``: ``[task(*item) for item in it]`` in one task."""

    task_name = "celery.starmap"

    def __repr__(self) -> str:
        task = maybe_signature(self.kwargs["task"])
        return f"[{task.task}(*x) for x in {repr(self.kwargs['it'])[:100]}]"


@Signature.register_type()
class chunks(Signature):
    """``task.chunks(it, n)``: the items in parts of ``n``, each part a ``starmap`` task,
    all in a group (so the result is a ``GroupResult`` of lists)."""

    @classmethod
    def from_dict(cls, data: Any, app: Any = None) -> Signature:
        """Chunks from their dict form."""
        kwargs = data["kwargs"]
        return cls(kwargs["task"], kwargs["it"], kwargs["n"], app=app,
                   **dict(data.get("options") or {}))

    def __init__(self, task: Any, it: Iterable[Any], n: int, **options: Any) -> None:
        app = options.pop("app", None)
        super().__init__("celery.chunks", (), {"task": task, "it": list(it), "n": n},
                         immutable=True, app=app, **options)

    def __call__(self, **options: Any) -> Any:
        return self.apply_async(**options)

    def group(self) -> group:
        """The group of ``starmap`` tasks, one per part."""
        task, items, size = self.kwargs["task"], iter(self.kwargs["it"]), int(self.kwargs["n"])
        parts = iter(lambda: list(itertools.islice(items, size)), [])
        return group([xstarmap(task, part, app=self._app) for part in parts], app=self._app)

    def to_flow(self, builder: FlowBuilder, args: Any = None, kwargs: Any = None, *,
                after: list[Any], many: bool, failure: str,
                options: Any = None) -> Planned:
        """The group of parts."""
        return self.group().to_flow(builder, args, kwargs, after=after, many=many,
                                    failure=failure, options=options)

    def apply_async(self, args: Any = None, kwargs: Any = None,  # type: ignore[override]
                    **options: Any) -> Any:
        """Send the group of parts."""
        return self.group().apply_async(args, kwargs, **options)

    def apply(self, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        """Run the parts here."""
        return self.group().apply(args, kwargs, **options)

    @classmethod
    def apply_chunks(cls, task: Any, it: Iterable[Any], n: int, app: Any = None) -> Any:
        """``chunks(task, it, n)()``."""
        return cls(task, it, n, app=app)()
