"""``app.control``: revoke and purge (Celery's remote control, done in the database)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import psycopg

from akadze_core import request_cancel_sync
from akadze_core.control import signal_number

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
        """Revoke tasks by id (or list of ids): a task that has not started never runs.

        A running task is not interrupted unless ``terminate=True``: then a prefork worker
        sends ``signal`` (a name such as ``"SIGKILL"``/``"KILL"`` or a number, as Celery
        takes it; SIGTERM by default) to the child process running it. A child that dies of
        it is replaced, and the task ends REVOKED without spending an attempt
        (``task_revoked`` is sent with ``terminated=True``). Threads and solo workers cannot
        stop a running body: there, as without ``terminate``, a task that returns succeeds
        and one that raises ends REVOKED. Unknown ids are ignored, as in Celery.
        """
        signum = signal_number(signal or "SIGTERM") if terminate else None
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        core = self.app.core
        for one in ids:
            job = lookup_job(core, str(one))
            if job is not None:
                job_id = job.id

                def cancel(connection: psycopg.Connection, job_id: int = job_id) -> bool:
                    if signum is None:
                        return request_cancel_sync(connection, job_id)
                    return request_cancel_sync(connection, job_id, terminate=True,
                                               signal=signum)

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
