"""Celery-compatible facade over akadze_core: ``from akadze_compat import Celery, shared_task``.

A Celery 5 project runs after replacing ``celery`` with ``akadze_compat`` in its imports;
``migration_guide/`` lists what differs.
"""

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

__all__ = ["Celery", "Signature", "Task", "chain", "chord", "chunks", "current_app",
           "current_task", "group", "maybe_signature", "shared_task", "signature", "states",
           "subtask", "transaction", "uuid", "xmap", "xstarmap"]
