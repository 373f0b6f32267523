"""``@app.task(pydantic=True)``: arguments validated into pydantic models, models returned
dumped to JSON data, as Celery 5.5+ does.

An argument annotated with a ``BaseModel`` subclass (or ``Optional`` of one, when not None)
is ``model_validate``'d from what was sent (a dict), with ``strict=pydantic_strict`` and
``context={**pydantic_context, "celery_app": app, "celery_task_name": name}``; a returned
model that is an instance of the return annotation is ``model_dump(**pydantic_dump_kwargs)``'d
(``mode="json"`` unless given). pydantic is imported only when a task asks for this
(``pip install 'akadze[pydantic]'``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..exceptions import ImproperlyConfigured

if TYPE_CHECKING:
    from .base import Celery

__all__ = ["pydantic_wrapper"]


def _optional_of(annotation: Any) -> Any:
    """``X`` of ``Optional[X]`` / ``X | None`` (exactly two members), else None."""
    origin = typing.get_origin(annotation)
    if origin is not typing.Union and origin is not types.UnionType:
        return None
    members = typing.get_args(annotation)
    if len(members) != 2 or type(None) not in members:
        return None
    return next(member for member in members if member is not type(None))


def _is_class(annotation: Any) -> bool:
    return inspect.isclass(annotation) and not isinstance(annotation, types.GenericAlias)


def pydantic_wrapper(app: Celery, fun: Callable[..., Any], name: str, strict: bool = False,
                     context: dict[str, Any] | None = None,
                     dump_kwargs: dict[str, Any] | None = None) -> Callable[..., Any]:
    """``fun`` wrapped to validate its model arguments and dump its model result."""
    try:
        pydantic = importlib.import_module("pydantic")
    except ModuleNotFoundError as exc:
        raise ImproperlyConfigured("You need to install pydantic to use pydantic model "
                                   "serialization (pip install 'akadze[pydantic]')") from exc
    base_model: Any = pydantic.BaseModel
    context = dict(context or {})
    dump = dict(dump_kwargs or {})
    dump.setdefault("mode", "json")
    signature = inspect.signature(fun)
    try:
        # `from __future__ import annotations` leaves strings: resolve them if possible.
        hints: dict[str, Any] | None = typing.get_type_hints(fun)
    except (NameError, AttributeError, TypeError):
        hints = None

    def annotation_of(parameter: str) -> Any:
        if hints and parameter in hints:
            return hints[parameter]
        if parameter == "return":
            return signature.return_annotation
        return signature.parameters[parameter].annotation

    def validated(args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments:
        bound = signature.bind(*args, **kwargs)
        for parameter, value in bound.arguments.items():
            annotation = annotation_of(parameter)
            inner = _optional_of(annotation)
            if inner is not None and value is not None:
                annotation = inner
            if _is_class(annotation) and issubclass(annotation, base_model):
                bound.arguments[parameter] = annotation.model_validate(
                    value, strict=strict,
                    context={**context, "celery_app": app, "celery_task_name": name})
        return bound

    def dumped(value: Any) -> Any:
        annotation = annotation_of("return")
        inner = _optional_of(annotation)
        if inner is not None:
            annotation = inner
        if _is_class(annotation) and isinstance(value, base_model) \
                and isinstance(value, annotation):
            return value.model_dump(**dump)
        return value

    if inspect.iscoroutinefunction(fun):
        @functools.wraps(fun)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = validated(args, kwargs)
            return dumped(await fun(*bound.args, **bound.kwargs))

        return async_wrapper

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = validated(args, kwargs)
        return dumped(fun(*bound.args, **bound.kwargs))

    return wrapper
