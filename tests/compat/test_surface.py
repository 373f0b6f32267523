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


class OrderFailed(Exception):
    """An exception built from more than a message."""

    def __init__(self, order: int, reason: str) -> None:
        super().__init__(order, reason)
        self.order, self.reason = order, reason


async def test_ignore_leaves_the_state_as_it_was(celery: Celery) -> None:
    """``raise Ignore()`` stores nothing in Celery: PENDING stays PENDING, and a custom
    FAILURE set by ``update_state`` (Celery's documented pattern) reads as that failure."""
    from akadze_compat.exceptions import Ignore

    @celery.task(name="ignore.plain")
    def plain() -> None:
        raise Ignore()

    @celery.task(bind=True, name="ignore.custom")
    def custom(self: Task) -> None:
        self.update_state(state=states.FAILURE, meta={
            "exc_type": "OrderFailed", "exc_message": [7, "no stock"],
            "exc_module": __name__, "custom": "kept"})
        raise Ignore()

    @celery.task(bind=True, name="ignore.progress")
    def progress(self: Task) -> None:
        self.update_state(state="PROGRESS", meta={"done": 3})
        raise Ignore()

    first, second, third = plain.delay(), custom.delay(), progress.delay()
    jobs = [first, second, third]
    await work(celery, lambda: all(celery.core.get_job(r.job_id).state == "succeeded"
                                   for r in jobs))
    assert first.state == states.PENDING and first.result is None and not first.ready()
    assert second.state == states.FAILURE and second.failed()
    exc = second.result
    assert isinstance(exc, OrderFailed) and exc.args == (7, "no stock") and exc.order == 7
    with pytest.raises(OrderFailed):
        second.get(timeout=5)
    assert (third.state, third.result) == ("PROGRESS", {"done": 3})


async def test_a_failure_comes_back_with_its_class_and_arguments(celery: Celery) -> None:
    """As Celery's JSON results: the exception is its class called with its ``args``; a
    class the reader cannot find is a stand-in of that name, holding the same args."""

    @celery.task(name="fail.args")
    def failing(kind: str) -> None:
        if kind == "key":
            raise KeyError("missing")
        if kind == "order":
            raise OrderFailed(12, "card declined")
        if kind == "many":
            raise ValueError("bad", 3, {"field": "x"}, object)
        raise RuntimeError()

    key, order, many, empty = (failing.delay(kind) for kind in ("key", "order", "many", "x"))
    await work(celery, finished(key, order, many, empty))
    assert isinstance(key.result, KeyError) and key.result.args == ("missing",)
    assert str(key.result) == "'missing'"
    assert isinstance(order.result, OrderFailed)
    assert (order.result.order, order.result.reason) == (12, "card declined")
    with pytest.raises(OrderFailed) as raised:
        order.get(timeout=5)
    assert raised.value.args == (12, "card declined")
    assert many.result.args == ("bad", 3, {"field": "x"}, repr(object))
    assert isinstance(empty.result, RuntimeError) and empty.result.args == ()
    # a class this process cannot import: a stand-in of the same name and arguments
    job = celery.core.get_job(order.job_id)
    entry = dict(job.errors[-1], module="not_a_module_here", type="GoneError")
    from akadze_compat.backends.base import exception_from_entry
    gone = exception_from_entry(entry)
    assert type(gone).__name__ == "GoneError" and gone.args == (12, "card declined")
    assert isinstance(gone, Exception)


async def test_request_properties_and_task_received(celery: Celery) -> None:
    """``self.request.properties`` holds the message properties Celery's does, with the
    ones given to ``apply_async`` (app_id...); ``task_received`` is sent with a request
    that has Celery's Request attributes."""
    seen: dict[str, Any] = {}
    received: list[Any] = []

    def on_received(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        received.append((request.id, request.name, request.task_name, request.args,
                         request.kwargs, request.task, request.hostname,
                         request.delivery_info["routing_key"]))

    signals.task_received.connect(on_received)

    @celery.task(bind=True, name="props.read")
    def read(self: Task, x: int) -> None:
        seen[self.request.id] = self.request.properties

    try:
        given = read.apply_async((1,), app_id="myapp", user_id="guest", priority=3,
                                 headers={"h1": "v"})
        plain = read.delay(2)
        await work(celery, finished(given, plain))
    finally:
        signals.task_received.disconnect(on_received)
    properties = seen[given.id]
    assert properties["app_id"] == "myapp" and properties["user_id"] == "guest"
    assert properties["correlation_id"] == given.id and properties["priority"] == 3
    assert properties["delivery_mode"] == 2
    assert properties["delivery_info"] == {"exchange": "", "routing_key": "celery"}
    assert "app_id" not in seen[plain.id]
    assert sorted(received, key=lambda entry: entry[3]) == [
        (given.id, "props.read", "props.read", [1], {}, read, received[0][6], "celery"),
        (plain.id, "props.read", "props.read", [2], {}, read, received[0][6], "celery")]
