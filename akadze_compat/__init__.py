"""Celery-compatible facade over akadze_core: ``from akadze_compat import Celery, shared_task``.

A Celery 5 project runs after replacing ``celery`` with ``akadze_compat`` in its imports, or
unchanged with the alias on (``AKADZE_CELERY=1``, ``akadze_compat.as_celery``), which makes
``import celery`` resolve to this package; ``migration_guide/`` lists what differs.
"""

from typing import NamedTuple

from . import states
from ._state import current_app, current_task
from .app.base import Celery, shared_task
from .app.publish import transaction
from .app.task import Task
from .canvas import (
    Signature,
    chain,
    chord,
    chunks,
    group,
    maybe_signature,
    signature,
    subtask,
    xmap,
    xstarmap,
)
from .utils import uuid


class version_info_t(NamedTuple):
    """A Celery version as a tuple (``celery.VERSION``)."""

    major: int
    minor: int
    micro: int
    releaselevel: str
    serial: str


#: The Celery release whose API this package follows (``celery.__version__`` with the alias
#: on: add-ons compare it to decide which Celery hooks exist). akadze's own version is the
#: ``akadze`` distribution's.
__version__ = "5.7.0"
SERIES = "collider"
VERSION_BANNER = f"{__version__} ({SERIES})"
VERSION = version_info = version_info_t(5, 7, 0, "", "")

__all__ = ["Celery", "Signature", "Task", "chain", "chord", "chunks", "current_app",
           "current_task", "group", "maybe_signature", "shared_task", "signature", "states",
           "subtask", "transaction", "uuid", "xmap", "xstarmap"]
