"""``autoretry_for``: retry on listed exceptions, with Celery's exponential backoff.

The countdown for retry number ``retries`` (0 for the first run) with ``retry_backoff``
is ``min(retry_backoff_max, factor * 2 ** retries)`` where ``factor`` is
``int(max(1.0, retry_backoff))`` (so ``True`` means 1 s); with ``retry_jitter`` (the
default) it becomes ``randrange(countdown + 1)``: full jitter, anywhere from 0 to the cap.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..exceptions import Ignore, Retry

if TYPE_CHECKING:
    from .task import Task

__all__ = ["add_autoretry_behaviour", "autoretry_countdown", "exponential_backoff"]


def exponential_backoff(factor: int, retries: int, maximum: int, full_jitter: bool = False,
                        randrange: Callable[[int], int] = random.randrange) -> int:
    """Seconds to wait before retry number ``retries + 1`` (Celery's formula)."""
    countdown = min(maximum, factor * (2 ** retries))
    if full_jitter:
        countdown = randrange(countdown + 1)
    return max(0, countdown)


def autoretry_countdown(retry_backoff: bool | float, retries: int, retry_backoff_max: float,
                        retry_jitter: bool,
                        randrange: Callable[[int], int] = random.randrange) -> int | None:
    """The countdown ``autoretry_for`` passes to ``retry()``; None when backoff is off (the
    task's ``default_retry_delay`` or ``retry_kwargs["countdown"]`` then applies)."""
    if not float(retry_backoff):
        return None
    return exponential_backoff(int(max(1.0, float(retry_backoff))), retries,
                               int(retry_backoff_max), retry_jitter, randrange)


def add_autoretry_behaviour(task: Task, **options: Any) -> None:
    """Wrap ``task.run`` so the exceptions in ``autoretry_for`` call ``task.retry``.

    Options given to the decorator win over the task's attributes, as in Celery.
    """
    autoretry_for = tuple(options.get("autoretry_for", getattr(task, "autoretry_for", ())))
    dont_autoretry_for = tuple(options.get("dont_autoretry_for",
                                           getattr(task, "dont_autoretry_for", ())))
    retry_kwargs = options.get("retry_kwargs", getattr(task, "retry_kwargs", {}))
    retry_backoff = options.get("retry_backoff", getattr(task, "retry_backoff", False))
    retry_backoff_max = options.get("retry_backoff_max", getattr(task, "retry_backoff_max", 600))
    retry_jitter = options.get("retry_jitter", getattr(task, "retry_jitter", True))
    if not autoretry_for or hasattr(task, "_orig_run"):
        return
    original = task.run

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return task._orig_run(*args, **kwargs)  # type: ignore[attr-defined]
        except (Ignore, Retry):
            raise
        except dont_autoretry_for:
            raise
        except autoretry_for as exc:
            arguments = dict(retry_kwargs)
            countdown = autoretry_countdown(retry_backoff, task.request.retries,
                                            retry_backoff_max, retry_jitter)
            if countdown is not None:
                arguments["countdown"] = countdown
            if hasattr(task, "override_max_retries"):
                arguments["max_retries"] = task.override_max_retries
            try:
                # Raises Retry, or past max_retries the exception itself.
                task.retry(exc=exc, **arguments)
            finally:
                if hasattr(task, "override_max_retries"):
                    del task.override_max_retries
            raise AssertionError("Task.retry returned instead of raising") from exc

    task._orig_run, task.run = original, run  # type: ignore[attr-defined, method-assign]

