"""``celery.app.annotations``: the ``task_annotations`` setting, applied to task classes.

An annotation sets attributes on the tasks it matches when they are bound to the app:
``{"tasks.add": {"rate_limit": "10/s"}}`` for one task, ``{"*": {...}}`` for all, a key
starting with ``@`` wraps the method of that name (``{"@on_failure": wrapper}``), and an object
with ``annotate(task)`` (or a ``"module:Class"`` string naming its class) decides itself. The
setting is one of these or a list of them; for each task the first match by name applies,
then the first ``"*"`` one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kombu.utils.imports import symbol_by_name

__all__ = ["MapAnnotation", "prepare", "resolve_all"]


class MapAnnotation(dict[str, Any]):
    """Task name (or ``"*"``) -> the attributes to set."""

    def annotate_any(self) -> dict[str, Any] | None:
        """The attributes for every task, if any."""
        value = self.get("*")
        return dict(value) if value is not None else None

    def annotate(self, task: Any) -> dict[str, Any] | None:
        """The attributes for ``task``, if it is named."""
        value = self.get(task.name)
        return dict(value) if value is not None else None


def prepare(annotations: Any) -> list[Any]:
    """The setting's value as a list of annotation objects."""
    if annotations is None:
        return []
    if not isinstance(annotations, (list, tuple)):
        annotations = (annotations,)
    return [MapAnnotation(item) if isinstance(item, dict)
            else symbol_by_name(item)() if isinstance(item, str) else item
            for item in annotations]


def _first(annotations: list[Any], method: str, *args: Any) -> Any:
    for annotation in annotations:
        function = getattr(annotation, method, None)
        if function is None:
            continue
        reply = function(*args)
        if reply is not None:
            return reply
    return None


def resolve_all(annotations: list[Any], task: Any) -> Iterator[dict[str, Any]]:
    """The attribute maps that apply to ``task``: its first match by name, then the first
    match for every task."""
    for found in (_first(annotations, "annotate", task), _first(annotations, "annotate_any")):
        if found:
            yield found
