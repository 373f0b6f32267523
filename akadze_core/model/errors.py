"""Exceptions a task raises to steer its job, and the errors akadze raises to its callers."""

from __future__ import annotations

from datetime import timedelta

import psycopg


def _seconds(delay: timedelta | float | int) -> float:
    if isinstance(delay, timedelta):
        return delay.total_seconds()
    return float(delay)


class JobOutcome(Exception):
    """Base of the exceptions a task raises on purpose to decide what happens to its job."""


class Retry(JobOutcome):
    """Spend this attempt and run again after ``delay``, whatever the task's backoff policy.

    The delay is used as given (not clamped). Out of attempts, the job fails.
    ``max_attempts`` raises the job's attempt budget first (never lowers it), for callers
    that decide at run time how many retries a job deserves.
    """

    def __init__(self, delay: timedelta | float = 0.0, message: str | None = None,
                 max_attempts: int | None = None) -> None:
        self.delay = _seconds(delay)
        self.max_attempts = max_attempts
        super().__init__(message or f"retry in {self.delay:g}s")


class Snooze(JobOutcome):
    """Not ready yet: run again after ``delay`` without spending an attempt (for polling)."""

    def __init__(self, delay: timedelta | float = 0.0) -> None:
        self.delay = _seconds(delay)
        super().__init__(f"snoozed for {self.delay:g}s")


class Fail(JobOutcome):
    """Fail the job now, with no further attempts."""

    def __init__(self, reason: str = "failed by the task") -> None:
        self.reason = reason
        super().__init__(reason)


class Cancel(JobOutcome):
    """Cancel the job now; it will not run again."""

    def __init__(self, reason: str = "cancelled by the task") -> None:
        self.reason = reason
        super().__init__(reason)


class ResultNotJson(Exception):
    """The task returned a value that is not JSON; the attempt is spent and the job retried."""


class UnstorableOutcome(Exception):
    """The outcome can never be stored (e.g. a NUL character in the result): the job fails."""


class ResultTooLarge(UnstorableOutcome):
    """The result, as JSON, is over ``App(max_result_bytes=...)``: the job fails at once."""


class JobTimeout(Exception):
    """The run took longer than the task's ``timeout``; the attempt is spent."""


class AkadzeError(Exception):
    """Base of the errors akadze raises to callers."""


class InvalidArgs(AkadzeError, ValueError):
    """Job arguments that cannot be stored (not JSON, nested too deeply, NUL characters, lone
    surrogates, too big), or a queue name, task name, unique key or task id that is empty,
    too long (``MAX_NAME_LENGTH``) or unstorable."""


class UpstreamFailed(AkadzeError, ValueError):
    """A workflow job would wait on a job that failed, was cancelled or does not exist:
    it could never run, so nothing of the workflow is inserted."""


class NotOwner(AkadzeError):
    """This run no longer owns its job (rescued by another worker, or finished already)."""


class SchemaMissing(AkadzeError):
    """The akadze schema is not applied (or is older than this version): run ``akadze migrate``."""


class ConfigurationError(AkadzeError):
    """A setting is missing or wrong."""


class NoDatabaseError(ConfigurationError):
    """No URL is configured and the embedded Postgres does not exist yet; raised instead of
    creating it where that is not wanted (commands that only read)."""


class ConnectionLost(AkadzeError, psycopg.OperationalError):
    """The connection to Postgres broke after a statement was sent: whether it took effect
    (for an enqueue: whether the job was inserted) is unknown, so akadze does not retry it.

    Raised only when the statement may have run. A connection found dead before anything
    was sent (an idle connection after a server restart, failover or
    ``pg_terminate_backend``) is replaced and the call runs on the new one, unseen by the
    caller. A subclass of ``psycopg.OperationalError`` too, the error these calls raised
    before, so handlers written for that keep working. The psycopg error is chained.
    """


class DatabaseUnavailable(AkadzeError, psycopg.OperationalError):
    """Postgres could not be reached, or refused the connection for a reason that passes
    (the server is down, starting, shutting down, or has no free connections:
    ``max_connections`` reached): nothing was sent, so the call may be retried as it is.

    Not a ``ConfigurationError``: a wrong URL, a failed password, a missing database or role
    still raise that, since waiting does not fix them. A subclass of
    ``psycopg.OperationalError``, as ``ConnectionLost`` is; the facade raises it as kombu's
    ``OperationalError`` too, after Celery's publish retry policy.
    """
