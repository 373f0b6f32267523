"""The rest of the Celery surface projects touch, run by a real worker on a real Postgres:
``task_postrun`` after the state is stored, ``task_received``, ``request.properties``,
``app.backend``, ``Ignore`` keeping the state, failures rebuilt by class name and args."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from akadze_compat import Celery, Task, signals, states
from tests.compat.conftest import work


def finished(*results: Any) -> Callable[[], bool]:
    return lambda: all(result.ready() for result in results)


class Seen:
    """A ``task_postrun`` receiver reading the task's state as an app would."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.states: dict[str, tuple[str, Any, str | None]] = {}
        signals.task_postrun.connect(self)

    def __call__(self, sender: Any = None, task_id: str = "", state: str | None = None,
                 **kwargs: Any) -> None:
        result = self.app.AsyncResult(task_id)
        self.states[task_id] = (result.state, result.result, state)

    def close(self) -> None:
        signals.task_postrun.disconnect(self)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_task_postrun_sees_the_stored_state(celery: Celery, kind: str) -> None:
    """An app reading ``AsyncResult(task_id).state`` in its postrun receiver sees what
    Celery shows there: SUCCESS with the value, FAILURE with the exception, RETRY."""
    seen = Seen(celery)
    if kind == "sync":
        @celery.task(name="postrun.add")
        def add(x: int, y: int) -> int:
            return x + y

        @celery.task(name="postrun.boom")
        def boom() -> None:
            raise KeyError("nope")

        @celery.task(bind=True, name="postrun.again", max_retries=1)
        def again(self: Task) -> str:
            if self.request.retries == 0:
                raise self.retry(countdown=0)
            return "second"
    else:
        @celery.task(name="postrun.add")
        async def add(x: int, y: int) -> int:
            return x + y

        @celery.task(name="postrun.boom")
        async def boom() -> None:
            raise KeyError("nope")

        @celery.task(bind=True, name="postrun.again", max_retries=1)
        async def again(self: Task) -> str:
            if self.request.retries == 0:
                raise self.retry(countdown=0)
            return "second"

    ok, bad, retried = add.delay(2, 3), boom.delay(), again.delay()
    try:
        await work(celery, finished(ok, bad, retried))
    finally:
        seen.close()
    assert seen.states[ok.id] == (states.SUCCESS, 5, states.SUCCESS)
    state, exc, signalled = seen.states[bad.id]
    assert (state, signalled) == (states.FAILURE, states.FAILURE)
    assert isinstance(exc, KeyError)
    # the retry's postrun ran first (RETRY), then the second run's (SUCCESS)
    assert seen.states[retried.id] == (states.SUCCESS, "second", states.SUCCESS)
    assert ok.get(timeout=5) == 5 and retried.get(timeout=5) == "second"


async def test_task_postrun_sees_retry(celery: Celery) -> None:
    seen: list[str] = []

    def receiver(task_id: str = "", **kwargs: Any) -> None:
        seen.append(celery.AsyncResult(task_id).state)

    signals.task_postrun.connect(receiver)

    @celery.task(bind=True, name="postrun.retry", max_retries=1)
    def again(self: Task, value: str = "first") -> str:
        if self.request.retries == 0:
            raise self.retry(countdown=0, args=("changed",))
        return value

    try:
        result = again.delay()
        await work(celery, finished(result))
    finally:
        signals.task_postrun.disconnect(receiver)
    assert seen == [states.RETRY, states.SUCCESS]
    assert result.get(timeout=5) == "changed"  # the retry's new args were kept
