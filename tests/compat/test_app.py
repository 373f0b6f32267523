"""The Celery app: task registration, names, shared tasks, broker URLs, autodiscovery."""

from __future__ import annotations

import logging
import sys
import textwrap
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import akadze_compat
from akadze_compat import Celery, Task, _state, current_app, shared_task
from akadze_compat.app.base import database_url, gen_task_name
from akadze_compat.exceptions import ImproperlyConfigured, NotRegistered
from akadze_compat.result import AsyncResult


@pytest.fixture
def app() -> Iterator[Celery]:
    celery = Celery("proj", set_as_current=False)
    yield celery
    celery.close()


def test_signature_accepts_celerys_arguments() -> None:
    celery = Celery("proj", loader=None, backend="redis://x", amqp=None, events=None, log=None,
                    control=None, set_as_current=False, tasks=None, broker=None, include=["a"],
                    changes={"task_default_queue": "c"}, config_source=None, fixups=[],
                    task_cls=None, autofinalize=True, namespace="CELERY", strict_typing=False,
                    config_source_silent=True, worker_concurrency=3)
    assert celery.conf.include == ["a"]
    assert celery.conf.task_default_queue == "c"
    assert celery.conf.worker_concurrency == 3
    assert celery.conf.result_backend == "redis://x"
    assert celery.strict_typing is False and celery.namespace == "CELERY"


def test_task_decorator_forms(app: Celery) -> None:
    @app.task
    def plain() -> str:
        return "plain"

    @app.task()
    def called() -> str:
        return "called"

    @app.task(name="custom.name", bind=True)
    def named(self: Task) -> str:
        return self.name

    assert plain.name == "tests.compat.test_app.plain"
    assert called() == "called"
    assert named() == "custom.name"
    assert app.tasks["custom.name"] is named
    assert isinstance(plain, app.Task) and isinstance(plain, Task)
    with pytest.raises(TypeError):
        app.task("not callable")
    with pytest.raises(TypeError):
        app.task(len, len)


def test_same_name_twice_keeps_the_first(app: Celery) -> None:
    def first() -> int:
        return 1

    def second() -> int:
        return 2

    task = app.task(name="dup")(first)
    with pytest.warns(akadze_compat.exceptions.DuplicateTaskNameWarning):
        again = app.task(name="dup")(second)
    assert again is task and task() == 1


def test_gen_task_name_main_rule(app: Celery) -> None:
    assert gen_task_name(app, "f", "__main__") == "proj.f"
    assert gen_task_name(Celery(set_as_current=False), "f", "__main__") == "__main__.f"
    assert gen_task_name(app, "f", "some.module") == "some.module.f"


def test_unknown_task_raises_not_registered(app: Celery) -> None:
    with pytest.raises(NotRegistered) as info:
        app.tasks["nope"]
    assert isinstance(info.value, KeyError)


def test_shared_task_is_on_every_app() -> None:
    @shared_task(name="shared.add")
    def add(x: int, y: int) -> int:
        return x + y

    before = Celery("before", set_as_current=False)
    after = Celery("after")  # current app from now on
    try:
        assert "shared.add" in before.tasks and "shared.add" in after.tasks
        assert before.tasks["shared.add"] is not after.tasks["shared.add"]
        assert add.app is after  # the proxy follows the current app
        assert add(1, 2) == 3
        assert isinstance(add, Task)
        late = Celery("late", set_as_current=False)
        late.finalize()
        assert "shared.add" in late.tasks
    finally:
        before.close()
        after.close()


def test_shared_task_without_parentheses_uses_module_name() -> None:
    celery = Celery("current")

    @shared_task
    def subtract(x: int, y: int) -> int:
        return x - y

    assert subtract.name == "tests.compat.test_app.subtract"
    assert subtract.app is celery
    with pytest.raises(TypeError):
        shared_task(subtract)
    celery.close()


def test_current_app_and_default() -> None:
    first = Celery("first")
    assert current_app.main == "first"
    second = Celery("second", set_as_current=False)
    assert current_app._get_current_object() is first
    second.set_current()
    assert current_app.main == "second"
    first.close()
    second.close()


def test_task_cls_and_base() -> None:
    class Base(Task):
        marker = "base"

    class Other(Task):
        marker = "other"

    celery = Celery(set_as_current=False, task_cls=Base)
    by_path = Celery(set_as_current=False, task_cls="akadze_compat.app.task:Task")

    @celery.task
    def uses_app_base() -> None: ...

    @celery.task(base=Other)
    def uses_other() -> None: ...

    assert uses_app_base.marker == "base" and uses_other.marker == "other"
    assert issubclass(by_path.Task, Task)


def test_register_class_based_task(app: Celery) -> None:
    class Multiply(Task):
        name = "math.multiply"

        def run(self, x: int, y: int) -> int:
            return x * y

    task = app.register_task(Multiply())
    assert app.tasks["math.multiply"] is task and task(3, 4) == 12


def test_finalize_and_autofinalize() -> None:
    celery = Celery(set_as_current=False, autofinalize=False)
    seen: list[Any] = []

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        seen.append(sender)

    celery.on_after_finalize.connect(receiver)
    with pytest.raises(RuntimeError):
        celery.tasks  # noqa: B018
    celery.finalize()
    assert seen == [celery] and celery.finalized
    celery.finalize()
    assert seen == [celery]


@pytest.mark.parametrize("url", ["redis://localhost:6379/0", "amqp://guest:guest@rabbit//",
                                 "sqs://", "memory://"])
def test_non_postgres_broker_is_a_clear_error(url: str) -> None:
    with pytest.raises(ImproperlyConfigured, match="CELERY_BROKER_URL") as info:
        database_url(url)
    assert "guest@" not in str(info.value) or "****" in str(info.value)


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql://u:p@h/db", "postgresql://u:p@h/db"),
    ("postgres://h/db", "postgresql://h/db"),
    ("postgresql+psycopg://h/db", "postgresql://h/db"),
    ("sqla+postgresql://h/db", "postgresql://h/db"),
    (None, None),
])
def test_postgres_urls(url: str | None, expected: str | None) -> None:
    assert database_url(url) == expected


def test_redis_broker_fails_only_when_the_queue_is_needed() -> None:
    celery = Celery(broker="redis://localhost", set_as_current=False, task_always_eager=True)

    @celery.task
    def add(x: int, y: int) -> int:
        return x + y

    assert add.delay(1, 2).get() == 3  # eager: no queue involved
    with pytest.raises(ImproperlyConfigured, match="not a Postgres URL"):
        celery.core  # noqa: B018


def test_result_backend_is_ignored_with_one_info_line(caplog: pytest.LogCaptureFixture,
                                                      database_url: str) -> None:
    celery = Celery(broker=database_url, backend="redis://localhost/1", set_as_current=False)
    with caplog.at_level(logging.INFO, logger="akadze_compat.app"):
        celery.core  # noqa: B018
        celery.core  # noqa: B018
    lines = [r for r in caplog.records if "result_backend" in r.getMessage()]
    assert len(lines) == 1 and "ignored" in lines[0].getMessage()
    celery.close()


def test_pickle_serializer_is_refused_at_startup(database_url: str) -> None:
    celery = Celery(broker=database_url, set_as_current=False, task_serializer="pickle")
    with pytest.raises(ImproperlyConfigured, match="pickle"):
        celery.core  # noqa: B018


@pytest.fixture
def packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    # Fresh package names per test: shared tasks stay registered for the whole process.
    suffix = uuid.uuid4().hex[:8]
    for name, body in ((f"alpha{suffix}", "TASKS = 'alpha'"), (f"beta{suffix}", None)):
        package = tmp_path / f"akadze_pkg_{name}"
        package.mkdir()
        (package / "__init__.py").write_text("")
        if body:
            (package / "tasks.py").write_text(textwrap.dedent("""
                from akadze_compat import shared_task

                @shared_task
                def discovered():
                    return "found"
            """))
    monkeypatch.syspath_prepend(str(tmp_path))
    names = [f"akadze_pkg_alpha{suffix}", f"akadze_pkg_beta{suffix}"]
    # The shared task a discovered module defines would join every app made later in this
    # process, and a worker prepared for one imports its module, gone with tmp_path.
    shared_before = list(_state._on_finalize)
    yield names
    _state._on_finalize[:] = shared_before
    for module in [m for m in sys.modules if m.startswith("akadze_pkg_")]:
        del sys.modules[module]


def test_autodiscover_is_lazy_until_the_worker_imports(app: Celery,
                                                       packages: list[str]) -> None:
    app.autodiscover_tasks(lambda: packages)
    alpha = f"{packages[0]}.tasks"
    assert alpha not in sys.modules
    app.loader.import_default_modules()
    assert alpha in sys.modules
    assert f"{alpha}.discovered" in app.tasks
    assert app.loader.task_modules == {alpha}


def test_autodiscover_force(app: Celery, packages: list[str]) -> None:
    modules = app.autodiscover_tasks(packages, force=True)
    assert modules is not None and modules[1] is None
    assert modules[0].__name__ == f"{packages[0]}.tasks"


def test_autodiscover_django_installed_apps(app: Celery, packages: list[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Django itself is not a dependency: a stand-in with the two names Celery's fix-up uses.
    django = types.ModuleType("django")
    apps_module = types.ModuleType("django.apps")
    configs = [types.SimpleNamespace(name=name) for name in packages]
    apps_module.apps = types.SimpleNamespace(  # type: ignore[attr-defined]
        ready=True, get_app_configs=lambda: configs)
    django.setup = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "django", django)
    monkeypatch.setitem(sys.modules, "django.apps", apps_module)
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "proj.settings")
    app.autodiscover_tasks()
    app.loader.import_default_modules()
    assert f"{packages[0]}.tasks.discovered" in app.tasks


def test_imports_and_include_are_imported(app: Celery, packages: list[str]) -> None:
    app.conf.imports = (f"{packages[0]}.tasks",)
    app.conf.include = [packages[1]]
    app.loader.import_default_modules()
    assert {f"{packages[0]}.tasks", packages[1]} <= set(sys.modules)


def test_async_result_factories(app: Celery) -> None:
    @app.task
    def noop() -> None: ...

    result = app.AsyncResult("abc")
    assert isinstance(result, AsyncResult) and result.app is app and result.id == "abc"
    assert noop.AsyncResult("x").task_name == noop.name
    assert result == "abc" and str(result) == "abc" and repr(result) == "<AsyncResult: abc>"


def test_config_from_envvar(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ImproperlyConfigured):
        app.config_from_envvar("AKADZE_TEST_NO_SUCH_VARIABLE")
    monkeypatch.setenv("AKADZE_TEST_CONFIG", "tests.compat.config_cases:NewStyle")
    app.config_from_envvar("AKADZE_TEST_CONFIG")
    assert app.conf.task_default_queue == "default"
