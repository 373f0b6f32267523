"""``app.control``: revoke and purge (Celery's remote control, done in the database)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg

from akadze_core import request_cancel_sync

from ..backends.base import lookup_job
from ..utils.unsupported import not_provided

if TYPE_CHECKING:
    from .base import Celery

__all__ = ["Control"]

logger = logging.getLogger("akadze_compat.control")


class Control:
    """The part of Celery's ``app.control`` that has a meaning without brokers."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def revoke(self, task_id: str | Iterable[str], destination: Any = None,
               terminate: bool = False, signal: Any = "SIGTERM", **kwargs: Any) -> None:
        """Revoke tasks by id (or list of ids): a queued task never runs.

        A running task is not interrupted (``terminate`` is not supported): if it returns it
        succeeds, if it raises it ends REVOKED. Unknown ids are ignored, as in Celery.
        """
        if terminate:
            logger.warning("revoke(terminate=True): running tasks are not interrupted; "
                           "they end REVOKED if they raise, SUCCESS if they return")
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        core = self.app.core
        for one in ids:
            job = lookup_job(core, str(one))
            if job is not None:
                job_id = job.id

                def cancel(connection: psycopg.Connection, job_id: int = job_id) -> bool:
                    return request_cancel_sync(connection, job_id)

                core.run_pooled(cancel)

    def purge(self, connection: Any = None) -> int:
        """Delete every waiting task of every queue; returns how many."""
        return int(self.app.core.purge(None))

    def inspect(self, *args: Any, **kwargs: Any) -> Any:
        """Not available here: use ``akadze-compat inspect`` (the workers are in the DB)."""
        raise NotImplementedError("app.control.inspect() is not supported; "
                                  "use `akadze-compat inspect` or `akadze jobs list`")


__getattr__ = not_provided(__name__, {
    "Inspect": ("there is no broadcast to workers; `akadze-compat inspect` and `status` "
                "read the database", "0-what-does-not-come-along"),
    "flatten_reply": ("there are no worker replies to flatten",
                      "0-what-does-not-come-along"),
})
