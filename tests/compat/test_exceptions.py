"""akadze_compat.exceptions: Celery's exception types, hierarchy and constructors."""

from __future__ import annotations

import builtins
import pickle
from datetime import datetime

import click
import kombu.exceptions
import pytest

from akadze_compat import exceptions
from akadze_compat.exceptions import (
    CeleryError,
    Ignore,
    MaxRetriesExceededError,
    NotRegistered,
    QueueNotFound,
    Reject,
    Retry,
    RetryTaskError,
    SoftTimeLimitExceeded,
    TaskError,
    TaskPredicate,
    TimeLimitExceeded,
    TimeoutError,
    WorkerLostError,
    WorkerShutdown,
    WorkerTerminate,
)
from tests.compat.differential import observed


@pytest.mark.parametrize(
    ("child", "parent"),
    [
        (Retry, TaskPredicate), (Ignore, TaskPredicate), (Reject, TaskPredicate),
        (TaskPredicate, CeleryError), (TaskError, CeleryError),
        (MaxRetriesExceededError, TaskError), (TimeoutError, TaskError),
        (NotRegistered, KeyError), (NotRegistered, TaskError),
        (QueueNotFound, KeyError), (QueueNotFound, TaskError),
        (exceptions.ImproperlyConfigured, CeleryError),
        (exceptions.TaskRevokedError, TaskError),
        (exceptions.BackendStoreError, exceptions.BackendError),
        (exceptions.AlwaysEagerIgnored, exceptions.CeleryWarning),
        (exceptions.CeleryWarning, UserWarning),
        (exceptions.CDeprecationWarning, DeprecationWarning),
        (WorkerShutdown, SystemExit), (WorkerTerminate, SystemExit),
    ],
)
def test_hierarchy(child: type, parent: type) -> None:
    assert issubclass(child, parent)


@pytest.mark.parametrize(
    "error", [SoftTimeLimitExceeded, TimeLimitExceeded, WorkerLostError, exceptions.Terminated]
)
def test_pool_errors_are_plain_exceptions(error: type) -> None:
    # In Celery they come from billiard: an `except Exception` catches them, an
    # `except CeleryError` does not.
    assert issubclass(error, Exception)
    assert not issubclass(error, CeleryError)


def test_names_that_differ_from_builtins_or_kombu() -> None:
    assert TimeoutError is not builtins.TimeoutError
    assert exceptions.OperationalError is kombu.exceptions.OperationalError
    assert not issubclass(exceptions.BackendError, CeleryError)
    assert issubclass(exceptions.CeleryCommandException, click.ClickException)


def test_aliases() -> None:
    assert RetryTaskError is Retry
    assert exceptions.SystemTerminate is WorkerTerminate


def test_every_exported_name_exists() -> None:
    for name in exceptions.__all__:
        assert hasattr(exceptions, name), name


class TestRetry:
    def test_defaults(self) -> None:
        retry = Retry()
        assert (retry.message, retry.exc, retry.when, retry.is_eager, retry.sig) == (
            None, None, None, False, None)
        assert str(retry) == "Retry at None"

    def test_countdown_and_cause(self) -> None:
        cause = ValueError("db down")
        retry = Retry(exc=cause, when=5)
        assert retry.exc is cause
        assert retry.humanize() == "in 5s"
        assert str(retry) == "Retry in 5s: ValueError('db down')"

    def test_eta(self) -> None:
        retry = Retry(when=datetime(2024, 1, 2, 3, 4, 5))
        assert retry.humanize() == "at 2024-01-02 03:04:05"

    def test_message_wins(self) -> None:
        assert str(Retry("try later", ValueError(), 3)) == "try later"

    def test_string_cause_is_a_description(self) -> None:
        retry = Retry(exc="remote said no", when=1.5)
        assert retry.exc is None
        assert str(retry) == "Retry in 1.5s: remote said no"

    def test_cause_with_a_broken_repr(self) -> None:
        class Opaque(Exception):
            def __repr__(self) -> str:
                raise RuntimeError("no repr")

        assert str(Retry(exc=Opaque(), when=1)) == "Retry in 1s: <unrepresentable Opaque object>"

    def test_unknown_keywords_are_rejected(self) -> None:
        with pytest.raises(TypeError):
            Retry(countdown=5)  # type: ignore[call-arg]

    def test_pickles(self) -> None:
        restored = pickle.loads(pickle.dumps(Retry("m", ValueError("x"), 3, is_eager=True)))
        assert (restored.message, repr(restored.exc), restored.when) == ("m", "ValueError('x')", 3)
        assert restored.is_eager is False  # as in Celery: only message, exc and when survive

    def test_args_and_repr_as_in_celery(self) -> None:
        retry = Retry(when=2)
        assert retry.args[0] is retry
        assert retry.args[1:] == (None, 2)
        assert repr(retry) == "Retry(Retry(...), None, 2)"


def test_reject() -> None:
    reject = Reject("bad payload", requeue=True)
    assert (reject.reason, reject.requeue) == ("bad payload", True)
    assert reject.args == ("bad payload", True)
    assert repr(reject) == "reject requeue=True: bad payload"
    assert Reject().requeue is False


def test_not_registered() -> None:
    error = NotRegistered("proj.tasks.add")
    assert str(error) == "'proj.tasks.add'"
    assert repr(error) == (
        "Task of kind 'proj.tasks.add' never registered, please make sure it's imported."
    )
    with pytest.raises(KeyError):
        raise error


def test_max_retries_exceeded_carries_the_task_arguments() -> None:
    error = MaxRetriesExceededError("gave up", task_args=(1, 2), task_kwargs={"a": 1})
    assert (error.args, error.task_args, error.task_kwargs) == (("gave up",), (1, 2), {"a": 1})
    bare = MaxRetriesExceededError()
    assert (bare.task_args, bare.task_kwargs) == ([], {})
    with pytest.raises(TypeError):
        MaxRetriesExceededError("x", task_name="t")  # type: ignore[call-arg]


def test_backend_errors() -> None:
    assert repr(exceptions.BackendGetMetaError("x", task_id="i")) == (
        "BackendGetMetaError('x') task_id:i")
    assert repr(exceptions.BackendStoreError("x", state="S", task_id="i")) == (
        "BackendStoreError('x') state:S task_id:i")


def test_time_limit_messages() -> None:
    assert str(SoftTimeLimitExceeded(3)) == "SoftTimeLimitExceeded(3,)"
    assert str(TimeLimitExceeded()) == "TimeLimitExceeded()"


def test_command_exception() -> None:
    error = exceptions.CeleryCommandException("bad usage", 2)
    assert (error.exit_code, error.message) == (2, "bad usage")


def test_reraise_keeps_the_exception() -> None:
    try:
        raise ValueError("original")
    except ValueError as exc:
        original = exc
    with pytest.raises(ValueError) as raised:
        exceptions.reraise(ValueError, original, original.__traceback__)
    assert raised.value is original


# --- differential: the same observations made on Celery 5.7 -------------------------------

KEYS = ["all", "classes", "aliases", "signatures", "class_defaults", "retry", "errors",
        "reject_fields", "max_retries_fields", "backend_fields", "shutdown_code",
        "command_exception", "reraise"]


@pytest.mark.parametrize("key", KEYS)
def test_matches_celery(key: str) -> None:
    celery, ours = observed("exceptions")
    assert ours[key] == celery[key]


def test_probe_keys_are_all_compared() -> None:
    celery, ours = observed("exceptions")
    assert sorted(celery) == sorted(ours) == sorted(KEYS)
