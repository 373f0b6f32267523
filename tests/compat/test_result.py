"""Results without a database: job -> Celery state, result and rebuilt exception."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest

from akadze_compat import states
from akadze_compat.backends.base import (
    exception_from_entry,
    failure_traceback,
    job_result,
    job_state,
)
from akadze_compat.exceptions import ChordError, MaxRetriesExceededError, TaskRevokedError
from akadze_compat.result import EagerResult
from akadze_compat.utils.serialization import UnpickleableExceptionWrapper
from akadze_core import Job


class PaymentDeclined(Exception):
    pass


class NeedsTwo(Exception):
    def __init__(self, a: str, b: str) -> None:
        super().__init__(a, b)


def make_job(state: str, attempt: int = 1, **fields: Any) -> Job:
    return Job(id=1, task="t", queue="celery", args={"args": [], "kwargs": {}}, state=state,
               priority=0, scheduled_at=datetime.now(timezone.utc), attempt=attempt,
               max_attempts=4, run_count=attempt, **fields)


@pytest.mark.parametrize(("state", "attempt", "meta", "track", "expected"), [
    ("queued", 0, {}, False, states.PENDING),
    ("queued", 1, {}, False, states.RETRY),
    ("running", 1, {}, False, states.PENDING),
    ("running", 1, {}, True, states.STARTED),
    ("running", 2, {}, False, states.RETRY),
    ("running", 2, {}, True, states.STARTED),
    ("running", 1, {"celery": {"state": "PROGRESS"}}, False, "PROGRESS"),
    ("succeeded", 1, {}, False, states.SUCCESS),
    ("failed", 3, {}, False, states.FAILURE),
    ("cancelled", 0, {}, False, states.REVOKED),
])
def test_job_state(state: str, attempt: int, meta: dict[str, Any], track: bool,
                   expected: str) -> None:
    assert job_state(make_job(state, attempt, meta=meta), track) == expected


def test_no_job_is_pending() -> None:
    assert job_state(None) == states.PENDING
    assert job_result(None, states.PENDING) is None


def entry(type_name: str, module: str | None, message: str = "boom") -> dict[str, Any]:
    return {"type": type_name, "module": module, "message": message, "traceback": "tb"}


def test_exceptions_are_rebuilt_by_type_and_module() -> None:
    rebuilt = exception_from_entry(entry("PaymentDeclined", __name__, "card"))
    assert type(rebuilt) is PaymentDeclined and str(rebuilt) == "card"
    assert type(exception_from_entry(entry("ValueError", "builtins"))) is ValueError
    assert type(exception_from_entry(entry("MaxRetriesExceededError",
                                           "akadze_compat.exceptions"))) \
        is MaxRetriesExceededError


def test_a_constructor_with_other_arguments_still_rebuilds() -> None:
    rebuilt = exception_from_entry(entry("NeedsTwo", __name__, "x"))
    # NeedsTwo("x") cannot be called: Celery's wrapper, naming the class and its args
    assert isinstance(rebuilt, UnpickleableExceptionWrapper)
    assert (rebuilt.exc_cls_name, rebuilt.exc_module, rebuilt.exc_args) == (
        "NeedsTwo", __name__, ("x",))
    assert str(rebuilt) == "NeedsTwo('x')"
    assert type(rebuilt.restore()).__name__ == "NeedsTwo"


def test_unknown_or_unsafe_types_become_a_stand_in() -> None:
    for made in (exception_from_entry(entry("Gone", "no.such.module_here")),
                 exception_from_entry(entry("Gone", "no.such.module_here"))):
        assert type(made).__name__ == "Gone" and type(made).__module__ == "no.such.module_here"
        assert isinstance(made, Exception)
    # A name that is not an Exception subclass is never instantiated as such.
    assert type(exception_from_entry(entry("path", "os"))).__name__ == "path"
    assert type(exception_from_entry(entry("SystemExit", "builtins"))).__bases__ == (
        Exception,)
    assert isinstance(exception_from_entry(entry("X", "bad module name!")), Exception)


def test_job_result() -> None:
    done = make_job("succeeded", result={"when": {"__type__": "date",
                                                  "__value__": "2024-01-02"}})
    assert job_result(done, states.SUCCESS) == {"when": datetime(2024, 1, 2).date()}
    failed = make_job("failed", errors=[entry("KeyError", "builtins")])
    assert isinstance(job_result(failed, states.FAILURE), KeyError)
    retry = make_job("queued", errors=[entry("Retry", "akadze_compat.exceptions")])
    assert job_result(retry, states.RETRY) is None
    assert isinstance(job_result(make_job("cancelled"), states.REVOKED), TaskRevokedError)
    progress = make_job("running", meta={"celery": {"state": "PROGRESS",
                                                    "result": {"done": 3}}})
    assert job_result(progress, "PROGRESS") == {"done": 3}


def upstream_failed(upstream: int, state: str, error: dict[str, Any] | None) -> dict[str, Any]:
    return {"type": "UpstreamFailed", "message": f"upstream job {upstream} {state}",
            "traceback": None, "upstream": upstream, "upstream_state": state,
            "upstream_error": error}


def test_a_step_after_a_failure_reads_the_failure() -> None:
    # Celery's _fail_chain stores the failure in every later step of the chain.
    never = make_job("cancelled", 0, errors=[
        upstream_failed(7, "failed", entry("PaymentDeclined", __name__, "card"))])
    assert job_state(never) == states.FAILURE
    exc = job_result(never, states.FAILURE)
    assert type(exc) is PaymentDeclined and str(exc) == "card"
    assert failure_traceback(never) == "tb"
    # Through a step cancelled before it (and a chord body that failed): the root's.
    body = upstream_failed(3, "failed", entry("KeyError", "builtins"))
    after_body = make_job("cancelled", 0, errors=[upstream_failed(
        8, "cancelled", upstream_failed(8, "failed", body))])
    assert job_state(after_body) == states.FAILURE
    assert isinstance(job_result(after_body, states.FAILURE, lambda i: f"task-{i}"),
                      ChordError)


def test_a_step_after_a_revoke_stays_pending() -> None:
    # A revoke stores nothing in the later steps: Celery leaves them PENDING.
    for revoked_error in (None, entry("Revoked", None, "revoked")):
        never = make_job("cancelled", 0, errors=[upstream_failed(7, "cancelled",
                                                                  revoked_error)])
        assert job_state(never) == states.PENDING
        assert job_result(never, states.PENDING) is None
        assert failure_traceback(never) is None
    nested = make_job("cancelled", 0, errors=[upstream_failed(
        8, "cancelled", upstream_failed(7, "cancelled", None))])
    assert job_state(nested) == states.PENDING


def test_eager_result() -> None:
    ok = EagerResult("id", 3, states.SUCCESS, name="t")
    assert (ok.get(), ok.state, ok.status, ok.ready(), ok.name) == (3, "SUCCESS", "SUCCESS",
                                                                    True, "t")
    failed = EagerResult("id", ValueError("v"), states.FAILURE, traceback="tb")
    with pytest.raises(ValueError):
        failed.get()
    assert isinstance(failed.get(propagate=False), ValueError) and failed.traceback == "tb"
    assert repr(ok) == "<EagerResult: id>"


def test_engine_errors_come_back_as_celery_exceptions() -> None:
    """What the core records itself (unknown task, lost worker, timeout) is rebuilt as the
    Celery exception a caller would catch."""
    from akadze_compat import exceptions
    from akadze_compat.backends.base import exception_from_entry

    unknown = exception_from_entry({"type": "NotRegistered", "module": "akadze_core.model.errors",
                                    "message": "unknown task 'x'"})
    assert isinstance(unknown, exceptions.NotRegistered)
    assert isinstance(exception_from_entry({"type": "WorkerLost", "message": "gone"}),
                      exceptions.WorkerLostError)
    assert isinstance(exception_from_entry({"type": "JobTimeout",
                                            "module": "akadze_core.model.errors",
                                            "message": "slow"}), exceptions.TimeLimitExceeded)
    # A user's own class of the same name is left alone.
    assert type(exception_from_entry({"type": "NotRegistered", "module": "myproj.errors",
                                       "message": ""})).__module__ == "myproj.errors"


def test_derived_results_are_copies_each_with_its_own_fields() -> None:
    """A group's members' results are copies of one (derived_results): each holds its own
    fields, so the job id given to one after the insert is not another's, and each carries
    whether results are ignored."""
    from akadze_compat import Celery
    from akadze_compat.result import AsyncResult, derived_results

    app = Celery("derived", broker="postgresql://unused@127.0.0.1:1/none", set_as_current=False)
    try:
        results = derived_results(app, app.backend, "t", 3, ignored=True)
        assert [type(result) for result in results] == [AsyncResult] * 3
        assert all(result.ignored and result.task_name == "t" for result in results)
        for job_id, result in enumerate(results, 7):
            result.job_id = job_id
        assert [result.job_id for result in results] == [7, 8, 9]
        assert len({id(result.__dict__) for result in results}) == 3
        assert derived_results(app, app.backend, "t", 2)[1].ignored is False
    finally:
        app.close()
