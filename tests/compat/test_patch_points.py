"""Celery's patch points on the hot path, which instrumentations (Sentry, New Relic, ddtrace,
OpenTelemetry) wrap: the worker runs every task through ``app.trace.build_tracer`` as it is
when the task runs, every send goes through ``Task.apply_async`` / ``Celery.send_task``,
``task_failure``'s ``einfo`` has billiard's shape, and the worker signals whose receivers
set such tools up reach the prefork children that run the tasks."""

from __future__ import annotations

import functools
import sys
import textwrap
import traceback
from pathlib import Path
from typing import Any

import psycopg
import pytest

from akadze_compat import Celery, Task, states
from akadze_compat.app import trace as trace_module
from akadze_compat.app.trace import ExceptionInfo, TraceInfo, task_has_custom, trace_ok_t
from tests.compat.cli_harness import wait_until
from tests.compat.conftest import SpawnCompat, work
from tests.compat.signal_recorder import Recorder


class Builds:
    """A ``build_tracer`` wrapper, as Sentry's: records each build and each traced call."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.built: list[str] = []
        self.calls: list[tuple[Any, list[Any], dict[str, Any], Any]] = []
        self.returned: list[Any] = []

    def __call__(self, name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        self.built.append(name)
        tracer = self.original(name, task, *args, **kwargs)

        def traced(*call: Any, **options: Any) -> Any:
            uuid, args_, kwargs_, request = call
            self.calls.append((uuid, list(args_), dict(kwargs_), request.get("headers")))
            returned = tracer(*call, **options)
            self.returned.append(returned)
            return returned
        return traced


async def test_a_build_tracer_wrapper_installed_after_the_first_task_applies(
        celery: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    @celery.task
    def add(x: int, y: int) -> int:
        return x + y

    before = add.delay(1, 1)
    await work(celery, lambda: before.ready())
    first = Builds(trace_module.build_tracer)
    monkeypatch.setattr(trace_module, "build_tracer", first)
    results = [add.apply_async((2, 3), headers={"custom": "yes"}), add.delay(4, 5)]
    await work(celery, lambda: all(result.ready() for result in results))
    assert [result.get(timeout=5) for result in results] == [5, 9]
    assert first.built == [add.name]  # built once for both runs
    assert sorted(first.calls, key=lambda call: call[1]) == [
        (results[0].id, [2, 3], {}, {"custom": "yes"}), (results[1].id, [4, 5], {}, None)]
    assert sorted(returned.retval for returned in first.returned) == [5, 9]
    assert all(isinstance(returned, trace_ok_t) and returned.info is None
               for returned in first.returned)

    second = Builds(first)  # a second wrapper, over the first
    monkeypatch.setattr(trace_module, "build_tracer", second)
    again = add.delay(6, 7)
    await work(celery, lambda: again.ready())
    assert again.get(timeout=5) == 13
    assert second.built == [add.name] and first.built == [add.name, add.name]
    assert [call[0] for call in second.calls] == [again.id]


async def test_a_wrapper_around_run_sees_the_exception_and_the_task_still_fails(
        celery: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sentry's shape: ``task.run`` replaced inside ``build_tracer``, before the original."""
    seen: list[BaseException] = []
    original = trace_module.build_tracer

    def build(name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        if not task_has_custom(task, "__call__"):
            run = task.run

            @functools.wraps(run)
            def wrapped(*a: Any, **k: Any) -> Any:
                try:
                    return run(*a, **k)
                except Exception as exc:
                    seen.append(exc)
                    raise
            task.run = wrapped
        return original(name, task, *args, **kwargs)

    monkeypatch.setattr(trace_module, "build_tracer", build)

    @celery.task
    def boom() -> None:
        raise LookupError("nope")

    result = boom.delay()
    await work(celery, lambda: result.ready())
    assert result.state == states.FAILURE and isinstance(result.result, LookupError)
    assert [type(exc) for exc in seen] == [LookupError]


class Proxy:
    """New Relic's shape: build_tracer is handed a proxy around the task, whose ``run``
    goes through its own ``__call__``."""

    def __init__(self, task: Task, calls: list[tuple[Any, ...]]) -> None:
        self.__dict__["_task"] = task
        self.__dict__["_calls"] = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # what Celery's task_has_custom asks
        return type(self._task)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._calls.append(args)
        return self._task(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)


async def test_the_body_runs_through_the_task_object_build_tracer_was_given(
        celery: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    original = trace_module.build_tracer
    monkeypatch.setattr(trace_module, "build_tracer",
                        lambda name, task, *a, **k: original(name, Proxy(task, calls), *a, **k))
    ids: list[Any] = []

    @celery.task(bind=True)
    def mul(self: Task, x: int, y: int) -> int:
        ids.append(self.request.id)
        return x * y

    result = mul.delay(3, 4)
    await work(celery, lambda: result.ready())
    assert result.get(timeout=5) == 12
    assert calls == [(3, 4)] and ids == [result.id]  # the request is the worker's


def test_task_has_custom_is_celerys_answer() -> None:
    app = Celery("custom", set_as_current=False)

    class Base(Task):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return super().__call__(*args, **kwargs)

    @app.task(base=Base)
    def custom() -> None:
        return None

    @app.task
    def plain() -> None:
        return None

    assert task_has_custom(custom, "__call__") is Base
    assert task_has_custom(plain, "__call__") is None
    assert task_has_custom(plain, "on_success") is None
    assert task_has_custom(plain, "run") is type(plain)


def test_a_tracer_called_outside_the_worker_runs_the_task_as_celery_does() -> None:
    app = Celery("direct", set_as_current=False)

    @app.task
    def div(x: int, y: int) -> float:
        return x / y

    tracer = trace_module.build_tracer(div.name, div, app=app)
    ok = tracer("id-1", (6, 3), {}, {"headers": {}})
    assert (ok.retval, ok.info) == (2, None)
    failed = tracer("id-2", (1, 0), {}, None)
    assert isinstance(failed.retval, ZeroDivisionError)
    assert isinstance(failed.info, TraceInfo) and failed.info.state == states.FAILURE


async def test_task_failure_einfo_has_billiards_shape(celery: Celery) -> None:
    recorder = Recorder("task_failure")
    try:
        @celery.task
        def fails() -> None:
            raise KeyError("missing")

        result = fails.delay()
        await work(celery, lambda: result.ready())
    finally:
        recorder.close()
    [(_, call)] = recorder.calls
    einfo = call["einfo"]
    assert isinstance(einfo, ExceptionInfo)
    assert einfo.type is KeyError and isinstance(einfo.exception, KeyError)
    assert einfo.exc_info == (KeyError, einfo.exception, einfo.tb)
    assert einfo.tb is call["traceback"] and einfo.internal is False
    assert "KeyError: 'missing'" in einfo.traceback and str(einfo) == einfo.traceback
    assert traceback.extract_tb(einfo.tb)[-1].name == "fails"


def test_exception_info_takes_the_exception_being_handled_as_billiards_does() -> None:
    try:
        raise ValueError("here")
    except ValueError:
        einfo = ExceptionInfo()
        given = ExceptionInfo(sys.exc_info(), internal=True)
    assert einfo.type is ValueError and str(einfo.exception) == "here"
    assert given.exc_info[:2] == einfo.exc_info[:2] and given.internal is True


async def test_every_send_goes_through_the_apply_async_and_send_task_on_the_class(
        celery: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrapper made with functools.wraps (it copies the wrapped method's attributes) on
    ``Task.apply_async`` sees ``delay``, also after a plain call was kept; one on
    ``Celery.send_task`` sees what apply_async sends."""
    headers: list[Any] = []

    @celery.task(bind=True)
    def add(self: Task, x: int, y: int) -> int:
        headers.append(self.request.headers)
        return x + y

    add.delay(0, 0)
    add.delay(0, 1)  # the plain call is kept by now
    applied: list[Any] = []
    sent: list[str] = []

    def wrap(method: Any, record: Any) -> Any:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            record(args)
            headers = dict(kwargs.get("headers") or {})
            headers["traced"] = "1"  # as the tracers add their headers
            kwargs["headers"] = headers
            return method(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(Task, "apply_async", wrap(Task.apply_async,
                                                  lambda args: applied.append(tuple(args[1]))))
    monkeypatch.setattr(Celery, "send_task", wrap(Celery.send_task,
                                                  lambda args: sent.append(args[1])))
    results = [add.delay(1, 2), add.delay(3, 4), add.apply_async((5, 6)),
               add.s(7, 8).apply_async(), celery.send_task(add.name, (9, 10))]
    assert applied == [(1, 2), (3, 4), (5, 6), (7, 8)]
    assert sent == [add.name] * 5
    await work(celery, lambda: all(result.ready() for result in results))
    assert [result.get(timeout=5) for result in results] == [3, 7, 11, 15, 19]
    traced = [header for header in headers if header and header.get("traced") == "1"]
    assert len(traced) == 5, headers


PROJECT = '''
import os
from akadze_compat import Celery, signals

app = Celery("hookproj")
OUT = os.environ["HOOKPROJ_OUT"]


def note(what):
    with open(OUT, "a") as out:
        out.write(f"{what} {os.getpid()}\\n")


@signals.celeryd_init.connect
def on_celeryd_init(sender=None, instance=None, conf=None, options=None, **kwargs):
    note("celeryd_init")


@signals.worker_init.connect
def on_worker_init(sender=None, **kwargs):
    note("worker_init")


@signals.worker_process_init.connect
def on_worker_process_init(sender=None, **kwargs):
    note("worker_process_init")


@app.task(name="hookproj.where")
def where():
    note("task")
'''


def test_prefork_children_get_celeryd_init_and_worker_init_before_worker_process_init(
        module_database_url: str, spawn_compat: SpawnCompat, tmp_path: Path) -> None:
    """What a receiver of celeryd_init or worker_init sets up (sentry_sdk.init, as Sentry's
    docs show) is in the process that runs the task, as in Celery's forked children."""
    (tmp_path / "hookproj.py").write_text(textwrap.dedent(PROJECT))
    out = tmp_path / "out.txt"
    worker = spawn_compat("-A", "hookproj", "worker", "-P", "prefork", "-c", "1", "-Q",
                          "hooks", "-l", "INFO", cwd=tmp_path,
                          env={"CELERY_BROKER_URL": module_database_url,
                               "HOOKPROJ_OUT": str(out)})
    worker.wait_ready(60)
    client = Celery("client", broker=module_database_url, set_as_current=False)
    try:
        client.send_task("hookproj.where", queue="hooks")
    finally:
        if client._core is not None:
            client._core.close()
        client.close()
    wait_until(lambda: out.exists() and any(
        line.startswith("task ") for line in out.read_text().splitlines()), timeout=30)
    lines = [line.split() for line in out.read_text().splitlines()]
    by_pid: dict[int, list[str]] = {}
    for what, pid in lines:
        by_pid.setdefault(int(pid), []).append(what)
    [child] = [pid for pid, seen in by_pid.items() if "task" in seen]
    assert child != worker.pid
    assert by_pid[child] == ["celeryd_init", "worker_init", "worker_process_init", "task"]
    assert by_pid[worker.pid] == ["celeryd_init", "worker_init"]

    def state() -> str | None:
        # The body wrote its line before it returned: the outcome follows it.
        with psycopg.connect(module_database_url) as connection:
            row = connection.execute(
                "SELECT state FROM akadze.jobs WHERE task = 'hookproj.where'").fetchone()
        return None if row is None else row[0]

    wait_until(lambda: state() == "succeeded", timeout=30)


async def test_request_headers_are_the_nested_headers_header_when_there_is_one(
        celery: Celery) -> None:
    """As Celery 5.7 gives them (seen on its worker): the custom headers are attributes of
    the request, and ``request.headers`` is the custom headers, or the custom header named
    "headers" (where ddtrace and Sentry nest their trace context) when there is one."""
    seen: list[tuple[Any, Any]] = []

    @celery.task(bind=True)
    def show(self: Task) -> None:
        seen.append((self.request.headers, getattr(self.request, "a", None)))

    results = [show.apply_async(headers={"a": 1}),
               show.apply_async(headers={"a": 1, "headers": {"b": 2}}), show.apply_async()]
    await work(celery, lambda: all(result.ready() for result in results), slots=1)
    assert sorted(seen, key=repr) == sorted([({"a": 1}, 1), ({"b": 2}, 1), (None, None)],
                                            key=repr)


def test_apply_goes_through_build_tracer_with_eager_as_celerys_apply(
        monkeypatch: pytest.MonkeyPatch) -> None:
    app = Celery("eager", set_as_current=False)
    builds: list[dict[str, Any]] = []
    original = trace_module.build_tracer

    def build(name: str, task: Any, *args: Any, **kwargs: Any) -> Any:
        builds.append({"name": name, "eager": kwargs.get("eager"),
                       "propagate": kwargs.get("propagate")})
        return original(name, task, *args, **kwargs)

    monkeypatch.setattr(trace_module, "build_tracer", build)

    @app.task
    def add(x: int, y: int) -> int:
        return x + y

    @app.task
    def fails() -> None:
        raise KeyError("x")

    assert add.apply((1, 2)).get() == 3
    with pytest.raises(KeyError):
        fails.apply(throw=True)
    assert fails.apply().state == states.FAILURE
    assert builds == [{"name": add.name, "eager": True, "propagate": False},
                      {"name": fails.name, "eager": True, "propagate": True},
                      {"name": fails.name, "eager": True, "propagate": False}]
