"""The rest of the Celery surface projects touch, run by a real worker on a real Postgres:
``task_postrun`` after the state is stored, ``task_received``, ``request.properties``,
``app.backend``, ``Ignore`` keeping the state, failures rebuilt by class name and args."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from akadze_compat import Celery, Task, signals, states
from akadze_compat.utils.serialization import UnpickleableExceptionWrapper
from tests.compat.conftest import work

try:
    import pydantic
except ImportError:  # an optional dependency: its test is skipped without it
    pydantic = None


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

    @celery.task(name="ignore.after")
    def after(*args: Any) -> str:
        return "ran"

    first, second, third = plain.delay(), custom.delay(), progress.delay()
    chained = (plain.si() | after.si()).delay()  # Celery applies no callback after Ignore
    jobs = [first, second, third, chained]
    await work(celery, lambda: all(celery.core.get_job(r.job_id).state == "cancelled"
                                   for r in jobs))
    assert chained.state == states.PENDING and chained.parent.state == states.PENDING
    assert celery.core.get_job(chained.job_id).started_at is None  # never ran
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


if pydantic is not None:
    # At module level: the tasks' annotations are strings here (from __future__ import
    # annotations), resolved with the module's globals, as in Celery.
    class Order(pydantic.BaseModel):
        id: int
        total: float

        @pydantic.field_validator("total")
        @classmethod
        def check(cls, value: float, info: Any) -> float:
            assert info.context["celery_task_name"] in ("pyd.total", "pyd.strict",
                                                        "pyd.dumped")
            if info.context["celery_task_name"] == "pyd.total":
                assert info.context["tenant"] == "acme"
            return value

    class Receipt(pydantic.BaseModel):
        order_id: int
        due: Any


@pytest.mark.skipif(pydantic is None, reason="pydantic is not installed")
async def test_pydantic_tasks_validate_and_dump(celery: Celery) -> None:
    """``@app.task(pydantic=True)`` as Celery 5.5+: model arguments validated from dicts
    (strict or not, with the context), model results dumped to JSON data."""
    seen: list[Any] = []

    @celery.task(pydantic=True, name="pyd.total", pydantic_context={"tenant": "acme"})
    def total(order: Order, note: Order | None = None) -> Receipt:
        seen.append((type(order).__name__, note))
        return Receipt(order_id=order.id, due=order.total * 2)

    @celery.task(pydantic=True, pydantic_strict=True, name="pyd.strict")
    def strict(order: Order) -> int:
        return order.id

    @celery.task(pydantic=True, name="pyd.dumped", pydantic_dump_kwargs={"exclude": {"due"}})
    async def dumped(order: Order) -> Receipt:
        return Receipt(order_id=order.id, due=1)

    ok = total.delay({"id": "3", "total": 2.5})  # lax: "3" becomes 3
    bad = total.delay({"id": "x", "total": 1})
    refused = strict.delay({"id": "3", "total": 1.0})  # strict: a str is not an int
    accepted = strict.delay({"id": 4, "total": 1.0})
    partial = dumped.delay({"id": 5, "total": 0})
    await work(celery, finished(ok, bad, refused, accepted, partial))
    assert ok.get(timeout=5) == {"order_id": 3, "due": 5.0}
    assert seen == [("Order", None)]
    assert bad.state == states.FAILURE
    assert isinstance(bad.result, UnpickleableExceptionWrapper)  # it cannot be rebuilt
    assert bad.result.exc_cls_name == "ValidationError"
    assert refused.state == states.FAILURE and accepted.get(timeout=5) == 4
    assert partial.get(timeout=5) == {"order_id": 5}
    # the option names are not task attributes, as in Celery
    assert not hasattr(total, "pydantic_context")
    # eager runs validate too
    assert total.apply(({"id": 1, "total": 1.0},)).get() == {"order_id": 1, "due": 2.0}


async def test_app_backend_reads_and_writes_what_a_job_holds(celery: Celery) -> None:
    """``app.backend``: Celery's reading methods answered from the job, ``store_result`` /
    ``mark_as_*`` for the running task (read back while it runs), ``_get_task_meta()``."""
    from akadze_compat.exceptions import Ignore

    during: dict[str, Any] = {}

    @celery.task(bind=True, name="backend.progress")
    def progress(self: Task) -> str:
        backend = self.backend
        assert backend is celery.backend
        backend.store_result(self.request.id, {"current": 1, "total": 2}, "PROGRESS")
        during["meta"] = celery.AsyncResult(self.request.id)._get_task_meta()
        backend.mark_as_started(self.request.id, pid=1)
        during["started"] = backend.get_state(self.request.id)
        return "done"

    @celery.task(bind=True, name="backend.failed")
    def failed(self: Task) -> None:
        self.backend.mark_as_failure(self.request.id, OrderFailed(9, "gone"))
        raise Ignore()

    @celery.task(name="backend.boom")
    def boom() -> None:
        raise ValueError("bad", 2)

    done, custom, error = progress.delay(), failed.delay(), boom.delay()
    ended = ("succeeded", "cancelled", "failed")
    await work(celery, lambda: all(celery.core.get_job(r.job_id).state in ended
                                   for r in (done, custom, error)))
    assert during["meta"]["status"] == "PROGRESS"
    assert during["meta"]["result"] == {"current": 1, "total": 2}
    assert during["started"] == states.STARTED
    backend = celery.backend
    meta = backend.get_task_meta(done.id)
    assert set(meta) == {"status", "result", "traceback", "children", "date_done", "task_id"}
    assert (meta["status"], meta["result"], meta["task_id"]) == (states.SUCCESS, "done",
                                                                 done.id)
    assert meta["date_done"] is not None and done._get_task_meta() == meta
    assert backend.get_result(done.id) == "done" and backend.get_status(done.id) == "SUCCESS"
    assert backend.get_state(custom.id) == states.FAILURE
    assert isinstance(backend.get_result(custom.id), OrderFailed)
    failure = backend.get_task_meta(error.id)
    assert failure["status"] == states.FAILURE and failure["result"].args == ("bad", 2)
    assert "ValueError" in failure["traceback"]
    assert backend.get_task_meta("no-such-id")["status"] == states.PENDING
    # Celery's JSON exception form, both ways; never an import of a non-exception
    encoded = backend.prepare_exception(OrderFailed(1, "x"))
    assert encoded == {"exc_type": "OrderFailed", "exc_message": [1, "x"],
                       "exc_module": __name__}
    assert backend.exception_to_python(encoded).args == (1, "x")
    odd = backend.exception_to_python({"exc_type": "system", "exc_module": "os",
                                       "exc_message": ["rm -rf /"]})
    assert isinstance(odd, Exception) and type(odd).__name__ == "system"
    # outside a run nothing can be stored: warned, nothing changes
    backend.store_result(done.id, "other", states.SUCCESS)
    assert backend.get_result(done.id) == "done"
    backend.forget(done.id)
    # mark_as_revoked revokes
    later = progress.apply_async(countdown=3600)
    backend.mark_as_revoked(later.id)
    assert later.state == states.REVOKED


def test_app_amqp_has_the_queue_declarations(celery: Celery) -> None:
    from kombu import Queue

    assert set(celery.amqp.queues) == {"celery"}  # Celery's t/integration checks this
    assert celery.amqp.default_queue.name == "celery"
    assert celery.amqp.default_queue.routing_key == "celery"
    celery.conf.task_queues = [Queue("high", queue_arguments={"x-queue-type": "quorum"}),
                               "low"]
    queues = celery.amqp.queues
    assert list(queues) == ["high", "low"]
    assert queues["high"].queue_arguments == {"x-queue-type": "quorum"}
    assert celery.amqp.router.route({}, "any.task", (), {}, None)["queue"] == "celery"
    with pytest.raises(AttributeError, match="no messages or producers"):
        celery.amqp.producer_pool  # noqa: B018


POSTRUN_PROJECT = '''
import json, os
from akadze_compat import Celery, signals
from akadze_compat.exceptions import Ignore

app = Celery("postrunproj")
OUT = os.environ["POSTRUN_OUT"]


@app.task(name="postrunproj.ok")
def ok(x):
    return x * 2


@app.task(name="postrunproj.boom")
def boom():
    raise KeyError("nope")


@signals.task_postrun.connect
def seen(task_id=None, state=None, **kwargs):
    result = app.AsyncResult(task_id)
    with open(OUT, "a") as out:
        out.write(json.dumps([task_id, result.state, state, os.getpid()]) + "\\n")


@signals.task_received.connect
def received(request=None, **kwargs):
    with open(OUT, "a") as out:
        out.write(json.dumps(["received", request.id, request.name]) + "\\n")
'''


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["prefork", "threads", "solo"])
def test_postrun_in_a_real_worker_sees_the_stored_state(
        pool: str, tmp_path: Any, database_url: str, spawn_compat: Any) -> None:
    """The command's worker, every pool: a postrun receiver (in a prefork child too) reads
    SUCCESS/FAILURE; task_received is sent in the process that runs the task."""
    import json
    import os

    from tests.compat.cli_harness import wait_until

    (tmp_path / "postrunproj.py").write_text(POSTRUN_PROJECT)
    out = tmp_path / "seen.jsonl"
    env = {"POSTRUN_OUT": str(out), "CELERY_BROKER_URL": database_url,
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    worker = spawn_compat("-A", "postrunproj", "worker", "-P", pool, "-c", "2", "-l", "INFO",
                          cwd=tmp_path, env=env)
    worker.wait_ready()
    client = Celery("postrunproj", broker=database_url, set_as_current=False)
    try:
        good = client.send_task("postrunproj.ok", (21,))
        bad = client.send_task("postrunproj.boom")
        assert good.get(timeout=30) == 42

        def lines() -> list[Any]:
            text = out.read_text() if out.exists() else ""
            return [json.loads(line) for line in text.splitlines()]

        wait_until(lambda: len(lines()) >= 4, timeout=30)
    finally:
        client.close()
    by_id = {line[0]: line[1:] for line in lines() if line[0] != "received"}
    assert by_id[good.id][:2] == [states.SUCCESS, states.SUCCESS]
    assert by_id[bad.id][:2] == [states.FAILURE, states.FAILURE]
    if pool == "prefork":
        assert by_id[good.id][2] != worker.pid  # ran in a child
    received = {line[1]: line[2] for line in lines() if line[0] == "received"}
    assert received == {good.id: "postrunproj.ok", bad.id: "postrunproj.boom"}


EXCEPTION_CASES = [
    ("builtins", "KeyError", ["missing"]),
    ("builtins", "ValueError", ["bad", 3, {"field": "x"}]),
    ("builtins", "RuntimeError", []),
    ("builtins", "UnicodeDecodeError", ["utf-8"]),  # cannot be called with these args
    ("no_such_module_here", "GoneError", [12, "card declined"]),
]

CELERY_EXCEPTIONS_SCRIPT = '''
import json
from celery import Celery
backend = Celery("d", backend="cache+memory://", result_serializer="json").backend
out = []
for module, name, args in %r:
    exc = backend.exception_to_python(
        {"exc_type": name, "exc_module": module, "exc_message": args})
    out.append([type(exc).__name__, list(exc.args), str(exc)])
print(json.dumps(out, default=repr))
'''


@pytest.mark.slow
def test_failures_rebuild_as_celery_json_results_do() -> None:
    """Differential: Celery 5.7's JSON backend against ours, on the same class, module and
    arguments. Where Celery cannot call the class with the arguments it hands back a plain
    ``Exception("<class ...>(args)")``; ours hands back its ``UnpickleableExceptionWrapper``
    (which its own integration test accepts): both name the class and hold the args."""
    import json

    from akadze_compat.backends.base import exception_from_entry
    from tests.compat.celery_reference import run_celery

    celery = run_celery(CELERY_EXCEPTIONS_SCRIPT % (EXCEPTION_CASES,))
    for (module, name, args), (celery_type, celery_args, celery_text) in zip(
            EXCEPTION_CASES, celery, strict=True):
        ours = exception_from_entry({"type": name, "module": module, "message": "",
                                     "args": args})
        if celery_type == "Exception" and name != "Exception":  # Celery's fallback
            assert name in celery_text
            assert isinstance(ours, UnpickleableExceptionWrapper)
            assert (ours.exc_cls_name, list(ours.exc_args or ())) == (name, args)
            assert name in str(ours)
            continue
        assert (type(ours).__name__, json.loads(json.dumps(list(ours.args)))) == \
            (celery_type, celery_args), name
        assert str(ours) == celery_text
