"""Celery's exception and warning types (``celery.exceptions``), same names and hierarchy.

Code that catches ``celery.exceptions.X`` keeps working after the import rename because
every class here has Celery's name, its base classes (compared by name) and its
constructor. The hierarchy::

    Exception
        CeleryError
            ImproperlyConfigured, SecurityError
            TaskPredicate: Ignore, Reject, Retry (alias RetryTaskError)
            TaskError: QueueNotFound (also KeyError), NotRegistered (also KeyError),
                       IncompleteStream, AlreadyRegistered, TimeoutError,
                       MaxRetriesExceededError, TaskRevokedError, InvalidTaskError, ChordError
        BackendError: BackendGetMetaError, BackendStoreError
        KombuError: OperationalError (kombu's own class, as in Celery)
        SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError, Terminated
    SystemExit: WorkerShutdown, WorkerTerminate (alias SystemTerminate)
    UserWarning: CeleryWarning and its subclasses
    PendingDeprecationWarning / DeprecationWarning: CPendingDeprecationWarning / CDeprecationWarning
    click.ClickException: CeleryCommandException

How the worker treats the task predicates (Ignore, Reject, Retry) is decided by
``akadze_compat.app.trace``; this module only defines the types.
"""

from __future__ import annotations

import numbers
from datetime import datetime
from types import TracebackType
from typing import Any, NoReturn

from click import ClickException

# Celery re-exports kombu's OperationalError rather than defining its own, so that
# ``except kombu.exceptions.OperationalError`` and ``except celery.exceptions.OperationalError``
# are the same handler. kombu is one of our runtime dependencies, so we re-export it too.
from kombu.exceptions import OperationalError

__all__ = (
    "AlreadyRegistered",
    "AlwaysEagerIgnored",
    "BackendError",
    "BackendGetMetaError",
    "BackendStoreError",
    "CDeprecationWarning",
    "CPendingDeprecationWarning",
    "CeleryCommandException",
    "CeleryError",
    "CeleryWarning",
    "ChordError",
    "DuplicateNodenameWarning",
    "DuplicateTaskNameWarning",
    "FixupWarning",
    "Ignore",
    "ImproperlyConfigured",
    "IncompleteStream",
    "InvalidTaskError",
    "MaxRetriesExceededError",
    "NotConfigured",
    "NotRegistered",
    "OperationalError",
    "QueueNotFound",
    "Reject",
    "Retry",
    "SecurityError",
    "SecurityWarning",
    "SoftTimeLimitExceeded",
    "TaskError",
    "TaskPredicate",
    "TaskRevokedError",
    "Terminated",
    "TimeLimitExceeded",
    "TimeoutError",
    "WorkerLostError",
    "WorkerShutdown",
    "WorkerTerminate",
    "reraise",
)


def reraise(
    tp: type[BaseException] | None, value: BaseException, tb: TracebackType | None = None
) -> NoReturn:
    """Raise ``value`` again with traceback ``tb`` (``tp`` is ignored, as in Celery)."""
    if value.__traceback__ is not tb:
        raise value.with_traceback(tb)
    raise value


# --- Warnings ---------------------------------------------------------------------------


class CeleryWarning(UserWarning):
    """Base class of the facade's warnings."""


class AlwaysEagerIgnored(CeleryWarning):
    """``send_task`` does not run the task eagerly even when ``task_always_eager`` is set."""


class DuplicateNodenameWarning(CeleryWarning):
    """More than one worker uses the same node name."""


class DuplicateTaskNameWarning(CeleryWarning):
    """Two different callables were registered under one task name."""


class FixupWarning(CeleryWarning):
    """A framework fixup (e.g. Django) could not be applied."""


class NotConfigured(CeleryWarning):
    """No configuration was found, so the defaults are in use."""


class SecurityWarning(CeleryWarning):
    """A setting looks like a potential security problem."""


class CPendingDeprecationWarning(PendingDeprecationWarning):
    """An API that will be deprecated."""


class CDeprecationWarning(DeprecationWarning):
    """An API that is deprecated."""


# --- Errors -----------------------------------------------------------------------------


class CeleryError(Exception):
    """Base class of the facade's errors (other than the worker-pool ones)."""


class ImproperlyConfigured(CeleryError):
    """The configuration is wrong or incomplete (for instance a non-Postgres broker URL)."""


class SecurityError(CeleryError):
    """A security-related failure."""


class TaskPredicate(CeleryError):
    """Base class of the exceptions a task raises to tell the worker what to do next."""


def _describe(value: object) -> str:
    """``repr(value)``, or a fallback when the object's ``__repr__`` itself fails."""
    try:
        return repr(value)
    except Exception:  # a broken __repr__ must not hide the retry that is being reported
        return f"<unrepresentable {type(value).__name__} object>"


class Retry(TaskPredicate):
    """Raised (normally by ``Task.retry``) to have the task run again later.

    ``exc`` is the exception that caused the retry, or a string describing it;
    ``when`` is the delay in seconds or the ``datetime`` of the next attempt.
    """

    #: Optional text describing why the task is retried; replaces ``str(self)`` when set.
    message: str | None = None
    #: The exception that caused the retry, if any.
    exc: BaseException | None = None
    #: When the retry happens: a number of seconds or a ``datetime``.
    when: float | datetime | None = None

    def __init__(
        self,
        message: str | None = None,
        exc: BaseException | str | None = None,
        when: float | datetime | None = None,
        is_eager: bool = False,
        sig: Any = None,
        **kwargs: Any,
    ) -> None:
        # Celery accepts **kwargs in the signature but rejects any at run time
        # (they reach BaseException.__init__); keep both halves of that behaviour.
        if kwargs:
            raise TypeError(f"Retry() takes no keyword arguments, got {sorted(kwargs)}")
        self.message = message
        if isinstance(exc, str):
            # A string stands for an already formatted description of the error.
            self.exc = None
            self.excs: str | None = exc
        else:
            self.exc = exc
            self.excs = _describe(exc) if exc else None
        self.when = when
        self.is_eager = is_eager
        self.sig = sig
        # Celery's args are (self, exc, when); keeping them makes repr() and args identical.
        super().__init__(self, exc, when)

    def humanize(self) -> str:
        """Say when the retry happens: ``"in 5s"`` for a delay, ``"at <datetime>"`` otherwise."""
        if isinstance(self.when, numbers.Number):
            return f"in {self.when}s"
        return f"at {self.when}"

    def __str__(self) -> str:
        if self.message:
            return self.message
        if self.excs:
            return f"Retry {self.humanize()}: {self.excs}"
        return f"Retry {self.humanize()}"

    def __reduce__(self) -> tuple[Any, ...]:
        # args hold self, so the default reduction would recurse; rebuild from the fields.
        return type(self), (self.message, self.exc, self.when)


#: Old name of :class:`Retry`, still importable from Celery.
RetryTaskError = Retry


class Ignore(TaskPredicate):
    """Raised by a task to end without recording a state or result."""


class Reject(TaskPredicate):
    """Raised by a task to reject its message, optionally putting it back on the queue."""

    def __init__(self, reason: Any = None, requeue: bool = False) -> None:
        self.reason = reason
        self.requeue = requeue
        super().__init__(reason, requeue)

    def __repr__(self) -> str:
        return f"reject requeue={self.requeue}: {self.reason}"


class TaskError(CeleryError):
    """Base class of errors about a task or its result."""


class QueueNotFound(KeyError, TaskError):
    """The task was routed to a queue that is not declared (``task_create_missing_queues``)."""


class IncompleteStream(TaskError):
    """A stream of data ended before it was complete."""


class NotRegistered(KeyError, TaskError):
    """No task is registered under this name (is the module that defines it imported?)."""

    def __repr__(self) -> str:
        # str(self) is KeyError's: the quoted task name.
        return f"Task of kind {self} never registered, please make sure it's imported."


class AlreadyRegistered(TaskError):
    """A task with this name is already registered (kept for imports; Celery never raises it)."""


class TimeoutError(TaskError):  # shadows the builtin on purpose: Celery's name
    """Waiting for a result (``AsyncResult.get(timeout=...)``) took too long."""


class MaxRetriesExceededError(TaskError):
    """``Task.retry`` was called after the task's ``max_retries`` were used up.

    ``task_args`` and ``task_kwargs`` carry the arguments of the task that gave up.
    """

    def __init__(
        self, *args: Any, task_args: Any = None, task_kwargs: Any = None
    ) -> None:
        self.task_args = [] if task_args is None else task_args
        self.task_kwargs = {} if task_kwargs is None else task_kwargs
        super().__init__(*args)


class TaskRevokedError(TaskError):
    """The task was revoked, so it has no result."""


class InvalidTaskError(TaskError):
    """A task message is malformed or carries invalid data."""


class ChordError(TaskError):
    """A task that is part of a chord failed."""


class BackendError(Exception):
    """Reading or writing task results failed."""


class BackendGetMetaError(BackendError):
    """Reading a task's result failed; ``task_id`` says which."""

    def __init__(self, *args: Any, task_id: str = "", **kwargs: Any) -> None:
        # Celery ignores any other keyword; so do we, rather than fail while reporting.
        super().__init__(*args)
        self.task_id = task_id

    def __repr__(self) -> str:
        return f"{super().__repr__()} task_id:{self.task_id}"


class BackendStoreError(BackendError):
    """Storing a task's result failed; ``state`` and ``task_id`` say which."""

    def __init__(self, *args: Any, state: str = "", task_id: str = "", **kwargs: Any) -> None:
        super().__init__(*args)
        self.state = state
        self.task_id = task_id

    def __repr__(self) -> str:
        return f"{super().__repr__()} state:{self.state} task_id:{self.task_id}"


# --- Pool errors ------------------------------------------------------------------------
# Celery takes these four from billiard (its process pool), where each derives directly
# from Exception. We do not depend on billiard, so they are defined here with the same
# names, bases and str() format; ``isinstance(e, Exception)`` holds as in Celery.


class SoftTimeLimitExceeded(Exception):
    """Raised inside a running task when its ``soft_time_limit`` expires, so it can clean up."""

    def __str__(self) -> str:
        return f"SoftTimeLimitExceeded{self.args}"


class TimeLimitExceeded(Exception):
    """The task ran past its hard ``time_limit`` and was stopped."""

    def __str__(self) -> str:
        return f"TimeLimitExceeded{self.args}"


class WorkerLostError(Exception):
    """The worker running the task exited before the task finished."""


class Terminated(Exception):
    """The task was terminated on request."""


# --- Worker shutdown --------------------------------------------------------------------
# SystemExit subclasses, so that raising them stops the process unless caught explicitly.


class WorkerShutdown(SystemExit):
    """Ask the worker for a warm shutdown (finish running tasks, then exit)."""


class WorkerTerminate(SystemExit):
    """Ask the worker to stop immediately."""


#: Old name of :class:`WorkerTerminate`, still importable from Celery.
SystemTerminate = WorkerTerminate


class CeleryCommandException(ClickException):
    """A command-line error that carries the process exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message=message)
        # click 8.5 declares ``exit_code`` a ClassVar (one status per class), but Celery's
        # signature takes it per instance: keep it in the instance's own dict, where click
        # looks it up first, so that the code type-checks with old and new click alike.
        vars(self)["exit_code"] = exit_code
