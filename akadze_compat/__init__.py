"""Celery-compatible facade over akadze_core: ``from akadze_compat import Celery, shared_task``.

A Celery 5 project runs after replacing ``celery`` with ``akadze_compat`` in its imports;
``migration_guide/`` lists what differs.
"""

from . import states
from ._state import Proxy, current_app
from .app import Celery, shared_task
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
from .execution import current_task as _current_task
from .publish import transaction
from .task import Task
from .utils import uuid

#: The task being run here (by a worker or eagerly), or a proxy of None.
current_task = Proxy(_current_task, "current_task")

__all__ = ["Celery", "Signature", "Task", "chain", "chord", "chunks", "current_app",
           "current_task", "group", "maybe_signature", "shared_task", "signature", "states",
           "subtask", "transaction", "uuid", "xmap", "xstarmap"]
