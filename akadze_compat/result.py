"""Task results: ``AsyncResult`` reads the job row, ``EagerResult`` holds an eager run's.

There is no separate result backend: a task's state, return value and errors are its job's
columns. The Celery state is derived from the job (``job_state``); the exception of a failed
task is rebuilt from the job's last error entry by type and module only, never unpickled.
``get()`` blocks on Postgres LISTEN/NOTIFY until the job finishes, it does not poll.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from . import _state, states
from .backends.base import FINISHED, job_result, job_state, lookup_job
from .exceptions import TaskRevokedError, TimeoutError
from .serialization import revive

if TYPE_CHECKING:
    from akadze_core import Job

    from .app.base import Celery

__all__ = ["AsyncResult", "EagerResult"]


def assert_will_not_block() -> None:
    """Refuse to wait for a result inside a running task (a deadlock risk, as in Celery)."""
    if _state.get_current_worker_request() is not None:
        raise RuntimeError("Never call result.get() within a task!")


class AsyncResult:
    """The result of a task call, read from its job (Celery's ``AsyncResult``)."""

    def __init__(self, id: str, backend: Any = None, task_name: str | None = None,
                 app: Celery | None = None, parent: AsyncResult | None = None, *,
                 job_id: int | None = None) -> None:
        if id is None:
            raise ValueError(f"AsyncResult requires valid id, not {type(id)}")
        self.app = app or _state.get_current_app()
        self.id = str(id)
        self.backend = backend
        self.parent = parent
        self.task_name = task_name
        self._job_id = job_id
        self._cache: Job | None = None
        self.ignored = False

    # --- reading the job ---------------------------------------------------------------------

    def _job(self) -> Job | None:
        if self._cache is not None:
            return self._cache
        core = self.app.core
        job = core.get_job(self._job_id) if self._job_id is not None \
            else lookup_job(core, self.id)
        if job is not None:
            self._job_id = job.id
            if job.state in FINISHED:
                self._cache = job
        return job

    def _track_started(self, job: Job | None) -> bool:
        task = self.app.registry.get(job.task if job else self.task_name or "")
        if task is not None and task.track_started is not None:
            return bool(task.track_started)
        return bool(self.app.conf.task_track_started)

    def _meta(self) -> tuple[Job | None, str]:
        job = self._job()
        return job, job_state(job, self._track_started(job))

    @property
    def state(self) -> str:
        """PENDING, STARTED, RETRY, SUCCESS, FAILURE, REVOKED or a custom state."""
        return self._meta()[1]

    status = state

    @property
    def result(self) -> Any:
        """The return value; on FAILURE the exception; for a custom state its metadata."""
        job, state = self._meta()
        return job_result(job, state)

    info = result

    @property
    def traceback(self) -> str | None:
        """The traceback text of the last failure, if any."""
        job, state = self._meta()
        if job is None or not job.errors or state not in (states.FAILURE, states.RETRY):
            return None
        return job.errors[-1].get("traceback")

    def ready(self) -> bool:
        """Whether the task finished (SUCCESS, FAILURE or REVOKED)."""
        return self.state in states.READY_STATES

    def successful(self) -> bool:
        """Whether the task succeeded."""
        return self.state == states.SUCCESS

    def failed(self) -> bool:
        """Whether the task failed."""
        return self.state == states.FAILURE

    def exists(self) -> bool:
        """Whether a job exists for this id (PENDING alone cannot tell)."""
        return self._job() is not None

    @property
    def task_id(self) -> str:
        """Old name of ``id``."""
        return self.id

    @property
    def job_id(self) -> int | None:
        """The akadze_core job behind this task id (not in Celery), None when there is none:
        what ``app.core.get_job`` and SQL on ``akadze.jobs`` take. Task ids are uuid4
        strings kept in the job's ``meta["task_id"]``, not job ids."""
        if self._job_id is None:
            self._job()
        return self._job_id

    @property
    def name(self) -> str | None:
        """The task name."""
        job = self._job()
        return job.task if job else self.task_name

    @property
    def args(self) -> list[Any] | None:
        """The positional arguments of the call."""
        job = self._job()
        return revive(job.args.get("args")) if job and isinstance(job.args, dict) else None

    @property
    def kwargs(self) -> dict[str, Any] | None:
        """The keyword arguments of the call."""
        job = self._job()
        return revive(job.args.get("kwargs")) if job and isinstance(job.args, dict) else None

    @property
    def retries(self) -> int | None:
        """How many times the task was retried so far."""
        job = self._job()
        if job is None:
            return None
        return job.attempt if job.state == "queued" else max(0, job.attempt - 1)

    @property
    def queue(self) -> str | None:
        """The queue the job is in."""
        job = self._job()
        return job.queue if job else None

    @property
    def worker(self) -> str | None:
        """Not recorded (Celery's ``result_extended``); always None."""
        return None

    @property
    def date_done(self) -> datetime | None:
        """When the task finished (UTC), or None."""
        job = self._job()
        return job.finished_at if job and job.state in FINISHED else None

    @property
    def children(self) -> None:
        """Not tracked."""
        return None

    # --- waiting ------------------------------------------------------------------------------

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
            no_ack: bool = True, follow_parents: bool = True,
            callback: Callable[[str, Any], Any] | None = None, on_message: Any = None,
            on_interval: Any = None, disable_sync_subtasks: bool = True,
            EXCEPTION_STATES: frozenset[str] = states.EXCEPTION_STATES,
            PROPAGATE_STATES: frozenset[str] = states.PROPAGATE_STATES,
            ) -> Any:
        """Wait until the task finishes and return its result (or raise its exception).

        Raises ``akadze_compat.exceptions.TimeoutError`` after ``timeout`` seconds. Returns
        None at once for a call made with ``ignore_result``.
        """
        if self.ignored:
            return None
        if disable_sync_subtasks:
            assert_will_not_block()
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self._job()
        while job is None:
            # A task_id= given to a job that is not committed yet: look again now and then.
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("The operation timed out.")
            time.sleep(interval if deadline is None else
                       max(0.0, min(interval, deadline - time.monotonic())))
            job = self._job()
        if job.state not in FINISHED:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                job = self.app.core.wait_for_job(job.id, left)
            except builtins.TimeoutError:  # the core's; ours shadows the name
                raise TimeoutError("The operation timed out.") from None
            self._cache = job
        return self.maybe_throw(propagate=propagate, callback=callback)

    wait = get

    def maybe_throw(self, propagate: bool = True, callback: Callable[[str, Any], Any] | None =
                    None) -> Any:
        """Raise the task's exception if it failed (with ``propagate``); else return the
        result."""
        job, state = self._meta()
        value = job_result(job, state)
        if state in states.PROPAGATE_STATES and propagate:
            raise value if isinstance(value, BaseException) else Exception(value)
        if callback is not None:
            callback(self.id, value)
        return value

    maybe_reraise = maybe_throw

    # --- acting on the task -------------------------------------------------------------------

    def forget(self) -> None:
        """Drop the cached result. The job itself is removed by retention (result_expires)."""
        self._cache = None
        if self.parent:
            self.parent.forget()

    def revoke(self, connection: Any = None, terminate: bool = False, signal: Any = None,
               wait: bool = False, timeout: float | None = None) -> None:
        """Cancel the task: a queued task never runs; a running one is not interrupted."""
        self.app.control.revoke(self.id, connection=connection, terminate=terminate,
                                signal=signal, reply=wait, timeout=timeout)

    def as_tuple(self) -> tuple[Any, ...]:
        """``((id, parent), None)``, Celery's serialized form."""
        parent = self.parent
        return (self.id, parent and parent.as_tuple()), None

    def as_list(self) -> list[str]:
        """This id, then the parents' ids."""
        return [self.id, *(self.parent.as_list() if self.parent else [])]

    def __str__(self) -> str:
        return self.id

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.id}>"

    def __hash__(self) -> int:
        return hash(self.id)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AsyncResult):
            return other.id == self.id
        if isinstance(other, str):
            return other == self.id
        return NotImplemented

    def __copy__(self) -> AsyncResult:
        return type(self)(self.id, self.backend, self.task_name, self.app, self.parent,
                          job_id=self._job_id)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.id, None, self.task_name, None, self.parent))


class EagerResult(AsyncResult):
    """The result of a task run eagerly (``apply()`` or ``task_always_eager``)."""

    def __init__(self, id: str, ret_value: Any, state: str, traceback: str | None = None,
                 name: str | None = None) -> None:
        self.id = id
        self.app = None  # type: ignore[assignment]
        self.backend = None
        self.parent = None
        self.task_name = name
        self._result = ret_value
        self._state = state
        self._traceback = traceback
        self._name = name
        self._job_id = None
        self._cache = None
        self.ignored = False

    @property
    def state(self) -> str:
        """The state the eager run ended in."""
        return self._state

    status = state

    @property
    def result(self) -> Any:
        """The return value, or the exception."""
        return self._result

    info = result

    @property
    def traceback(self) -> str | None:
        """The traceback text of the failure, if any."""
        return self._traceback

    @property
    def name(self) -> str | None:
        """The task name."""
        return self._name

    def ready(self) -> bool:
        """Always True: the task already ran."""
        return True

    def exists(self) -> bool:
        """Always True."""
        return True

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
            no_ack: bool = True, follow_parents: bool = True,
            callback: Callable[[str, Any], Any] | None = None, on_message: Any = None,
            on_interval: Any = None, disable_sync_subtasks: bool = True,
            EXCEPTION_STATES: frozenset[str] = states.EXCEPTION_STATES,
            PROPAGATE_STATES: frozenset[str] = states.PROPAGATE_STATES,
            ) -> Any:
        """The return value; the exception is raised (``propagate``) or returned."""
        if self.successful():
            return self._result
        if self._state in states.PROPAGATE_STATES:
            if propagate:
                raise self._result if isinstance(self._result, Exception) \
                    else Exception(self._result)
            return self._result
        return None

    wait = get

    def maybe_throw(self, propagate: bool = True, callback: Any = None) -> Any:
        """Raise the exception of a failed run (with ``propagate``); else return the result."""
        if self._state in states.PROPAGATE_STATES and propagate:
            raise self._result if isinstance(self._result, Exception) \
                else Exception(self._result)
        if callback is not None:
            callback(self.id, self._result)
        return self._result

    def forget(self) -> None:
        """Nothing is stored for an eager result."""

    def revoke(self, *args: Any, **kwargs: Any) -> None:
        """Mark the result REVOKED (the task already ran, nothing is cancelled)."""
        self._state = states.REVOKED
        self._result = TaskRevokedError("revoked")
        self._traceback = None

    def __repr__(self) -> str:
        return f"<EagerResult: {self.id}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.id, self._result, self._state, self._traceback, self._name))
