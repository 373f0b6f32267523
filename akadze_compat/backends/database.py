"""``app.backend``: Celery's result backend methods, answered from the task's job.

There is no result store besides the job row (see ``backends.base``): reading methods
(``get_task_meta``, ``get_state``, ``get_result``...) read it, and writing methods can only
write what a job can hold while its task runs, the way ``update_state`` does: a custom state
and its metadata for the task this worker is running. A job's final state is written by the
worker when the run ends (the body's return value or exception), not by ``store_result``;
``mark_as_revoked`` revokes (cancels) the job; ``forget`` only drops cached results (the job
goes with retention, ``result_expires``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from akadze_core.integration import redact_json

from .. import _state, serialization, states
from ..exceptions import TaskRevokedError
from .base import custom_result

if TYPE_CHECKING:
    from ..app.base import Celery

__all__ = ["DatabaseBackend"]

logger = logging.getLogger("akadze_compat.backend")


class DatabaseBackend:
    """The result "backend" of an app: the jobs table of its database."""

    EXCEPTION_STATES = states.EXCEPTION_STATES
    READY_STATES = states.READY_STATES
    UNREADY_STATES = states.UNREADY_STATES
    serializer = "json"
    content_type = "application/json"
    content_encoding = "utf-8"
    accept = frozenset({"application/json"})
    persistent = True
    supports_native_join = False
    supports_autoexpire = True
    is_async = False
    #: Results are read from the row when asked for, so every read is current.
    thread_safe = True

    def __init__(self, app: Celery) -> None:
        self.app = app

    def __repr__(self) -> str:
        return f"<DatabaseBackend of {self.app.main or '__main__'}>"

    @property
    def url(self) -> str:
        """Where results live: the queue's own database (no password shown)."""
        return "akadze://(the queue's Postgres database)"

    def as_uri(self, include_password: bool = False) -> str:
        """``url``: results are in the queue's database."""
        return self.url

    @property
    def expires(self) -> Any:
        """``result_expires``: how long finished jobs are kept."""
        return self.app.conf.result_expires

    # --- reading -----------------------------------------------------------------------------

    def _result(self, task_id: Any) -> Any:
        return self.app.AsyncResult(str(task_id))

    def get_task_meta(self, task_id: Any, cache: bool = True) -> dict[str, Any]:
        """Celery's meta dict of a task: ``status``, ``result`` (an exception in FAILURE,
        RETRY, REVOKED), ``traceback``, ``children``, ``date_done`` (ISO text or None) and
        ``task_id``; with ``result_extended`` also ``name``, ``args``, ``kwargs``,
        ``retries`` and ``queue``."""
        result = self._result(task_id)
        state = result.state
        done = result.date_done if state in states.READY_STATES else None
        meta: dict[str, Any] = {
            "status": state, "result": result.result, "traceback": result.traceback,
            "children": [child.as_tuple() for child in (result.children or [])],
            "date_done": done.isoformat() if done is not None else None,
            "task_id": str(task_id),
        }
        if self.app.conf.get("result_extended"):
            meta.update(name=result.name, args=result.args, kwargs=result.kwargs,
                        worker=None, retries=result.retries, queue=result.queue)
        return meta

    def get_state(self, task_id: Any) -> str:
        """The task's state."""
        return str(self._result(task_id).state)

    get_status = get_state

    def get_result(self, task_id: Any) -> Any:
        """The task's result: its value, exception or custom state's metadata."""
        return self._result(task_id).result

    def get_traceback(self, task_id: Any) -> str | None:
        """The traceback of the task's failure, if any."""
        return self._result(task_id).traceback  # type: ignore[no-any-return]

    def get_children(self, task_id: Any) -> list[Any] | None:
        """The task's children as Celery serializes them (``as_tuple``), or None."""
        children = self._result(task_id).children
        return None if children is None else [child.as_tuple() for child in children]

    def reload_task_result(self, task_id: Any) -> None:
        """Nothing to reload: every read goes to the job."""

    def wait_for(self, task_id: Any, timeout: float | None = None, interval: float = 0.5,
                 no_ack: bool = True, on_interval: Any = None) -> dict[str, Any]:
        """Wait for the task to finish; its meta (raises TimeoutError after ``timeout``)."""
        self._result(task_id).get(timeout=timeout, propagate=False, interval=interval,
                                  disable_sync_subtasks=False)
        return self.get_task_meta(task_id)

    # --- writing -----------------------------------------------------------------------------

    def store_result(self, task_id: Any, result: Any, state: str, traceback: Any = None,
                     request: Any = None, **kwargs: Any) -> Any:
        """Store ``state`` with ``result`` as its metadata, as ``update_state`` does: only
        for the task this worker is running (the job is finished by the worker when the
        run ends, with the body's outcome); anything else is logged and ignored."""
        running = _state.worker_request.get()
        if running is None or str(running[1].id) != str(task_id):
            logger.warning("store_result(%s, %s): only the task a worker is running can "
                           "store a state (its job's outcome is written when it ends); "
                           "nothing was stored", task_id, state)
            return result
        task = running[0]
        task.update_state(task_id=str(task_id), state=state, meta=self.encode_meta(result))
        return result

    def encode_meta(self, result: Any) -> Any:
        """A result as stored: an exception as Celery's JSON ``{"exc_type", "exc_message",
        "exc_module"}``."""
        if isinstance(result, BaseException):
            # Stored in the job, where readers that do not know this worker's database
            # password see it: scrubbed of it, as a failure's error entry is.
            return redact_json(self.prepare_exception(result), self.app.core.redact)
        return result

    def mark_as_started(self, task_id: Any, **meta: Any) -> Any:
        """STARTED, with ``meta`` (pid, hostname...)."""
        return self.store_result(task_id, meta, states.STARTED)

    def mark_as_done(self, task_id: Any, result: Any, request: Any = None,
                     store_result: bool = True, state: str = states.SUCCESS) -> Any:
        """``state`` (SUCCESS) with ``result``, while the task runs (see ``store_result``)."""
        if store_result:
            self.store_result(task_id, result, state, request=request)
        return result

    def mark_as_failure(self, task_id: Any, exc: BaseException, traceback: Any = None,
                        request: Any = None, store_result: bool = True,
                        call_errbacks: bool = True, state: str = states.FAILURE) -> Any:
        """FAILURE with ``exc``, while the task runs: read back as that exception (raise
        ``Ignore`` after it to keep it, Celery's way to end with a custom failure)."""
        if store_result:
            self.store_result(task_id, exc, state, traceback=traceback, request=request)
        return exc

    def mark_as_retry(self, task_id: Any, exc: BaseException, traceback: Any = None,
                      request: Any = None, store_result: bool = True,
                      state: str = states.RETRY) -> Any:
        """RETRY with ``exc``, while the task runs (``self.retry()`` is the way to retry)."""
        if store_result:
            self.store_result(task_id, exc, state, traceback=traceback, request=request)
        return exc

    def mark_as_revoked(self, task_id: Any, reason: str = "", request: Any = None,
                        store_result: bool = True, state: str = states.REVOKED) -> Any:
        """Revoke the task (its job is cancelled: REVOKED)."""
        self.app.control.revoke(str(task_id))
        return TaskRevokedError(reason)

    def forget(self, task_id: Any) -> None:
        """Nothing is deleted: the job stays until retention removes it (result_expires)."""

    def cleanup(self) -> None:
        """Expired results are removed by the core's retention, not here."""

    def process_cleanup(self) -> None:
        """Nothing to clean after a task."""

    def on_task_call(self, producer: Any, task_id: Any) -> dict[str, Any]:
        """Nothing to add to a sent task."""
        return {}

    def ensure_chords_allowed(self) -> None:
        """Chords always work (they are workflow jobs)."""

    # --- exceptions and encoding -------------------------------------------------------------

    def prepare_exception(self, exc: BaseException, serializer: str | None = None) \
            -> dict[str, Any]:
        """Celery's JSON form of an exception."""
        cls = type(exc)
        return {"exc_type": getattr(cls, "__qualname__", cls.__name__),
                "exc_message": serialization.loads(serialization.dumps(
                    [arg if _encodes(arg) else repr(arg) for arg in exc.args])),
                "exc_module": cls.__module__}

    def exception_to_python(self, exc: Any) -> BaseException | None:
        """An exception from Celery's JSON form (never unpickled; its module is looked up
        among those already imported, never imported); an exception is returned as it is."""
        if not exc:
            return None
        if isinstance(exc, BaseException):
            return exc
        if not isinstance(exc, dict) or "exc_type" not in exc:
            raise ValueError("Exception information must include the exception type")
        rebuilt = custom_result(states.FAILURE, exc)
        return rebuilt if isinstance(rebuilt, BaseException) else None

    def prepare_value(self, result: Any) -> Any:
        """A value as stored (an AsyncResult as its tuple)."""
        as_tuple = getattr(result, "as_tuple", None)
        return as_tuple() if callable(as_tuple) else result

    def encode(self, data: Any) -> str:
        """JSON text of ``data`` (the facade's serialization: datetimes, UUIDs... typed)."""
        return serialization.dumps(data)

    def decode(self, payload: Any) -> Any:
        """``encode``'s inverse."""
        return serialization.loads(payload)


def _encodes(value: Any) -> bool:
    try:
        serialization.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True
