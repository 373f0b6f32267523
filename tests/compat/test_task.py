"""Tasks without a database: direct calls, eager mode, argument checks, retry arithmetic."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from akadze_compat import Celery, Task, states
from akadze_compat.app.autoretry import autoretry_countdown, exponential_backoff
from akadze_compat.app.task import Context, retry_arguments
from akadze_compat.exceptions import (
    Ignore,
    ImproperlyConfigured,
    MaxRetriesExceededError,
    Retry,
    TaskRevokedError,
)
from tests.compat.celery_reference import run_celery
from tests.compat.signal_recorder import Recorder


@pytest.fixture
def app() -> Iterator[Celery]:
    celery = Celery("proj", set_as_current=False, task_always_eager=True)
    yield celery
    celery.close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recording = Recorder("task_prerun", "task_postrun", "task_success", "task_failure",
                         "task_retry")
    yield recording
    recording.close()


def test_task_defaults_are_celerys(app: Celery) -> None:
    @app.task
    def noop() -> None: ...

    assert (noop.max_retries, noop.default_retry_delay, noop.autoretry_for, noop.retry_backoff,
            noop.retry_backoff_max, noop.retry_jitter, noop.throws) == (
        3, 180, (), False, 600, True, ())
    assert noop.name == "tests.compat.test_task.noop"
    app.finalize()
    assert (noop.ignore_result, noop.acks_late, noop.track_started, noop.typing) == (
        False, False, False, True)


def test_unknown_options_become_attributes(app: Celery) -> None:
    @app.task(custom_option=5, max_retries=None, queue="q")
    def noop() -> None: ...

    assert (noop.custom_option, noop.max_retries, noop.queue) == (5, None, "q")


def test_direct_call_runs_inline(app: Celery) -> None:
    @app.task(bind=True)
    def whoami(self: Task, x: int) -> tuple[Any, ...]:
        return self.request.called_directly, self.request.id, self.request.args, x

    assert whoami(4) == (True, None, (4,), 4)
    assert whoami.request.called_directly  # no request outside a call


def test_argument_checks(app: Celery) -> None:
    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(bind=True)
    def bound(self: Task, x: int) -> int:
        return x

    for call in (lambda: add.delay(1), lambda: add.delay(1, 2, 3),
                 lambda: add.apply_async((1,), {"z": 2}), lambda: bound.delay()):
        with pytest.raises(TypeError):
            call()
    assert bound.delay(3).get() == 3

    @app.task(typing=False)
    def loose(*args: Any) -> Any:
        return args

    app.conf.task_always_eager = False
    with pytest.raises(TypeError, match="list or tuple"):
        loose.apply_async(args="ab")
    with pytest.raises(TypeError, match="mapping"):
        loose.apply_async((), kwargs=[1])


def test_soft_limit_above_hard_limit_is_refused(app: Celery) -> None:
    @app.task(time_limit=1, soft_time_limit=2)
    def slow() -> None: ...

    with pytest.raises(ValueError, match="soft_time_limit"):
        slow.delay()


def test_eager_delay_round_trips_arguments_through_json(app: Celery) -> None:
    @app.task
    def echo(value: Any) -> Any:
        return value

    when = datetime(2024, 1, 2, 3, 4, tzinfo=timezone.utc)
    result = echo.delay({"when": when, "pair": (1, 2)})
    assert result.get() == {"when": when, "pair": [1, 2]}
    assert (result.state, result.successful(), result.ready()) == (states.SUCCESS, True, True)


def test_eager_failure(app: Celery) -> None:
    @app.task
    def boom() -> None:
        raise KeyError("nope")

    result = boom.delay()
    assert result.state == states.FAILURE and result.failed()
    with pytest.raises(KeyError):
        result.get()
    assert isinstance(result.get(propagate=False), KeyError)
    assert "KeyError" in (result.traceback or "")
    app.conf.task_eager_propagates = True
    with pytest.raises(KeyError):
        boom.delay()


def test_eager_retry_runs_again_with_new_arguments(app: Celery) -> None:
    seen: list[tuple[int, int]] = []

    @app.task(bind=True, max_retries=5)
    def countdown(self: Task, n: int) -> str:
        seen.append((self.request.retries, n))
        if n > 0:
            raise self.retry(args=(n - 1,), countdown=30)
        return "liftoff"

    assert countdown.delay(2).get() == "liftoff"
    assert seen == [(0, 2), (1, 1), (2, 0)]


def test_eager_max_retries(app: Celery) -> None:
    @app.task(bind=True, max_retries=1)
    def stubborn(self: Task, with_exc: bool) -> None:
        raise self.retry(exc=ValueError("cause") if with_exc else None)

    result = stubborn.delay(False)
    assert result.state == states.FAILURE
    assert isinstance(result.result, MaxRetriesExceededError)
    assert isinstance(stubborn.delay(True).result, ValueError)


def test_eager_retry_propagates_when_asked(app: Celery) -> None:
    @app.task(bind=True)
    def again(self: Task) -> None:
        raise self.retry(countdown=1)

    with pytest.raises(Retry):
        again.apply(throw=True)


def test_autoretry_for(app: Celery, recorder: Recorder) -> None:
    calls: list[int] = []

    @app.task(bind=True, autoretry_for=(KeyError,), dont_autoretry_for=(IndexError,),
              max_retries=2, retry_backoff=True)
    def flaky(self: Task, error: str) -> None:
        calls.append(self.request.retries)
        raise {"key": KeyError, "index": IndexError}[error]("x")

    result = flaky.delay("key")
    assert calls == [0, 1, 2]
    assert isinstance(result.result, KeyError)
    assert recorder.names().count("task_retry") == 2
    calls.clear()
    assert isinstance(flaky.delay("index").result, IndexError)
    assert calls == [0]


def test_autoretry_for_direct_calls_raises_the_exception(app: Celery) -> None:
    @app.task(autoretry_for=(KeyError,))
    def flaky() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        flaky()


def test_retry_in_a_direct_call_raises(app: Celery) -> None:
    @app.task(bind=True)
    def retrying(self: Task) -> None:
        raise self.retry(exc=ValueError("v"))

    with pytest.raises(ValueError):
        retrying()


def test_handlers_and_signals(app: Celery, recorder: Recorder) -> None:
    events: list[Any] = []

    class Base(Task):
        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            events.append(("before_start", args))

        def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
            events.append(("on_success", retval))

        def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any,
                       einfo: Any) -> None:
            events.append(("on_failure", type(exc).__name__, "ZeroDivisionError" in str(einfo)))

        def after_return(self, status: str, retval: Any, task_id: str, args: Any,
                         kwargs: Any, einfo: Any) -> None:
            events.append(("after_return", status, einfo))

    @app.task(base=Base)
    def divide(x: int, y: int) -> float:
        return x / y

    assert divide.delay(6, 3).get() == 2
    divide.delay(1, 0)
    assert events == [("before_start", (6, 3)), ("on_success", 2), ("after_return", "SUCCESS",
                                                                       None),
                      ("before_start", (1, 0)), ("on_failure", "ZeroDivisionError", True),
                      ("after_return", "FAILURE", None)]
    assert recorder.names() == ["task_prerun", "task_success", "task_postrun", "task_prerun",
                                "task_failure", "task_postrun"]
    prerun = recorder.calls[0][1]
    assert prerun["sender"] is divide and prerun["args"] == (6, 3)
    assert set(prerun) == {"sender", "task_id", "task", "args", "kwargs"}
    assert recorder.calls[1][1]["result"] == 2
    assert recorder.calls[2][1]["state"] == "SUCCESS" and recorder.calls[2][1]["retval"] == 2
    failure = recorder.calls[4][1]
    assert isinstance(failure["exception"], ZeroDivisionError)
    assert {"task_id", "exception", "args", "kwargs", "traceback", "einfo"} <= set(failure)


def test_custom_call_and_request_in_eager_mode(app: Celery) -> None:
    calls: list[str] = []

    class Logged(Task):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(self.name)
            return super().__call__(*args, **kwargs)

    @app.task(bind=True, base=Logged)
    def inner(self: Task) -> dict[str, Any]:
        request = self.request
        return {"id": request.id, "parent": request.parent_id, "root": request.root_id,
                "eager": request.is_eager, "direct": request.called_directly}

    @app.task(bind=True)
    def outer(self: Task) -> Any:
        return self.request.id, inner.delay().get(disable_sync_subtasks=False)

    outer_id, seen = outer.delay().get()
    assert seen["parent"] == outer_id and seen["root"] == outer_id
    assert seen["eager"] and not seen["direct"]
    assert calls == ["tests.compat.test_task.inner"]
    alone = inner.apply(task_id="fixed").get()
    assert alone["id"] == alone["root"] == "fixed" and alone["parent"] is None


def test_ignore_and_revoke_in_eager_mode(app: Celery) -> None:
    @app.task
    def ignored() -> None:
        raise Ignore()

    assert ignored.delay().state == states.IGNORED
    result = ignored.apply()
    result.revoke()
    with pytest.raises(TaskRevokedError):
        result.get()


def test_update_state_does_nothing_when_eager(app: Celery) -> None:
    @app.task(bind=True)
    def progress(self: Task) -> str:
        self.update_state(state="PROGRESS", meta={"done": 1})
        return "ok"

    assert progress.delay().get() == "ok"


def test_async_body_in_eager_mode(app: Celery) -> None:
    @app.task
    async def double(x: int) -> int:
        return x * 2

    assert double.delay(21).get() == 42


def test_pickle_is_refused_even_when_eager(app: Celery) -> None:
    app.conf.task_serializer = "pickle"

    @app.task
    def noop() -> None: ...

    with pytest.raises(ImproperlyConfigured, match="pickle"):
        noop.delay()


def test_context_timelimit_fills_both_limits() -> None:
    context = Context(timelimit=(10, 5))
    assert (context.time_limit, context.soft_time_limit) == (10, 5)
    assert Context().get("retries") == 0


def test_retry_arguments() -> None:
    app = Celery(set_as_current=False)

    @app.task
    def job(a: int, b: int = 0, *, c: int = 0) -> None: ...

    request = Context(args=[1], kwargs={"b": 2, "c": 3})
    assert retry_arguments(job, request, None, None) == ([1], {"b": 2, "c": 3})
    assert retry_arguments(job, request, (5, 6), None) == ([5, 6], {"c": 3})
    assert retry_arguments(job, request, None, {"a": 9}) == ([9], {"b": 2, "c": 3})
    assert retry_arguments(job, request, (7,), {"c": 1}) == ([7], {"c": 1})


@pytest.mark.parametrize(("factor", "retries", "maximum", "expected"), [
    (1, 0, 600, 1), (1, 3, 600, 8), (2, 4, 600, 32), (1, 20, 600, 600), (5, 2, 10, 10),
    (0, 3, 600, 0),
])
def test_exponential_backoff_without_jitter(factor: int, retries: int, maximum: int,
                                            expected: int) -> None:
    assert exponential_backoff(factor, retries, maximum) == expected


def test_full_jitter_is_randrange_of_the_cap() -> None:
    asked: list[int] = []

    def randrange(stop: int) -> int:
        asked.append(stop)
        return stop - 1

    assert exponential_backoff(1, 3, 600, True, randrange) == 8
    assert asked == [9]
    assert autoretry_countdown(False, 3, 600, True) is None
    assert autoretry_countdown(True, 3, 600, False) == 8
    assert autoretry_countdown(0.5, 3, 600, False) == 8  # the factor is at least 1
    assert autoretry_countdown(3.7, 1, 600, False) == 6  # int(3.7) * 2


BACKOFF_CASES = [(factor, retries, maximum, jitter)
                 for factor in (1, 2, 5) for retries in (0, 1, 4, 12)
                 for maximum in (10, 600) for jitter in (False, True)]

CELERY_BACKOFF_SCRIPT = f"""
import json, random
from celery.utils.time import get_exponential_backoff_interval
out = []
for index, (factor, retries, maximum, jitter) in enumerate({BACKOFF_CASES!r}):
    random.seed(index)
    out.append(get_exponential_backoff_interval(factor, retries, maximum, jitter))
print(json.dumps(out))
"""


def test_backoff_matches_celery() -> None:
    expected = run_celery(CELERY_BACKOFF_SCRIPT)
    ours = []
    for index, case in enumerate(BACKOFF_CASES):
        random.seed(index)
        ours.append(exponential_backoff(*case))
    assert ours == expected


def test_task_default_retry_delay_setting(app: Celery) -> None:
    @app.task
    def plain() -> None: ...

    @app.task(default_retry_delay=5)
    def own() -> None: ...

    assert plain.retry_delay() == 180
    app.conf.task_default_retry_delay = 30
    assert (plain.retry_delay(), own.retry_delay()) == (30, 5)
