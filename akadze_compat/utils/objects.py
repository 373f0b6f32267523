"""Telling a class's own method from the base's default one (Celery's ``celery.utils.objects``
has ``mro_lookup`` for the same question).

``Task`` marks its do-nothing handlers and the methods the fast paths stand in for with
``@default``; the tracer and the publisher ask ``overrides_default(task, name)`` whether a
subclass replaced one. A mark rather than a comparison with ``Task``'s own function, so that
the modules asking sit below ``akadze_compat.app.task`` and need not import it.

The mark names the function it was set on: a wrapper made with ``functools.wraps`` copies
the wrapped function's ``__dict__`` (so the mark too), and an instrumentation wrapper around
a default method (Sentry's, ddtrace's, New Relic's on ``Task.apply_async``) must count as
overridden, or a fast path would go around it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["default", "is_default", "overrides_default", "wraps_default"]

F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__akadze_default__"


def default(function: F) -> F:
    """Mark ``function`` as the base class's default, which a subclass may override."""
    setattr(function, _MARK, function)
    return function


def is_default(function: Any) -> bool:
    """Whether ``function`` is one marked with ``@default`` (not a wrapper copying the mark)."""
    return function is not None and getattr(function, _MARK, None) is function


def overrides_default(obj: Any, attribute: str) -> bool:
    """Whether ``obj``'s class defines its own ``attribute`` (not the ``@default`` one)."""
    return not is_default(getattr(type(obj), attribute, None))


def wraps_default(function: Any) -> bool:
    """Whether ``function`` is a wrapper around an ``@default`` one (it carries the mark of
    another function)."""
    mark = getattr(function, _MARK, None)
    return mark is not None and mark is not function
