"""``celery.app``: the app and its parts (``base``, ``task``, ``trace``, ...).

Only ``app_or_default`` is defined at this level (add-ons import it from here); ``Celery`` and
``shared_task`` are imported from the package root or ``.base``, which this package's
modules import in turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._state import get_current_app

if TYPE_CHECKING:
    from .base import Celery

__all__ = ["app_or_default"]


def app_or_default(app: Celery | None = None) -> Celery:
    """``app``, else the current app (made on first use, as Celery's default app)."""
    return get_current_app() if app is None else app
