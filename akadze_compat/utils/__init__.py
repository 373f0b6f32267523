"""Celery's ``celery.utils`` names that projects import (the logging helpers live in ``.log``).

Provided: ``uuid`` and its old name ``gen_unique_id``. The rest of Celery's ``celery.utils``
(``cached_property``, ``chunks``, ``nodename``, ``symbol_by_name`` aliases, ...) is internal
plumbing that Celery itself marks as kept only for backwards compatibility.
"""

from __future__ import annotations

import uuid as _uuid_module

__all__ = ("gen_unique_id", "uuid")


def uuid() -> str:
    """Return a new random id in UUID4 text form, as Celery uses for task ids."""
    return str(_uuid_module.uuid4())


#: Old name of :func:`uuid`.
gen_unique_id = uuid
