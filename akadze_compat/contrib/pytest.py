"""Celery's pytest fixtures, on akadze (``celery.contrib.pytest`` after the rename).

Enable it as with Celery 5, in the top ``conftest.py``::

    pytest_plugins = ("akadze_compat.contrib.pytest",)

(or ``pytest -p akadze_compat.contrib.pytest``). The fixtures keep Celery's names, scopes
and overrides: redefine ``celery_config``, ``celery_parameters``, ``celery_includes``,
``celery_worker_pool``, ``celery_worker_parameters``, ``celery_enable_logging``,
``use_celery_app_trap`` or ``celery_class_tasks`` in a conftest, and set per-test settings
with ``@pytest.mark.celery(**settings)``. ``celery_app`` is a fresh app per test on the
test database (``akadze_compat.contrib.testing.app`` says which one and applies the
schema); ``celery_worker`` is a real worker on it, in a thread of the test process; the
``celery_session_*`` twins live for the whole run. ``NO_WORKER=1`` skips the workers, as
in Celery.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from akadze_compat import Celery

from .testing import worker
from .testing.app import TestApp, setup_default_app

__all__ = ["celery_app", "celery_class_tasks", "celery_config", "celery_enable_logging",
           "celery_includes", "celery_parameters", "celery_session_app",
           "celery_session_worker", "celery_worker", "celery_worker_parameters",
           "celery_worker_pool", "depends_on_current_app", "use_celery_app_trap"]

#: Celery's switch: set, the worker fixtures yield None instead of starting a worker.
NO_WORKER = os.environ.get("NO_WORKER")


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``celery`` marker (suites run with ``--strict-markers``)."""
    config.addinivalue_line(
        "markers", "celery(**overrides): override celery configuration for a test case")


@contextmanager
def _create_app(enable_logging: bool = False, use_trap: bool = False,
                parameters: Mapping[str, Any] | None = None,
                **config: Any) -> Iterator[Celery]:
    """A test app for the block; the current and default apps are put back afterwards."""
    app = TestApp(set_as_current=False, enable_logging=enable_logging, config=config,
                  **dict(parameters or {}))
    with setup_default_app(app, use_trap=use_trap):
        yield app


def _config(request: pytest.FixtureRequest, celery_config: Mapping[str, Any]) -> dict[str, Any]:
    """``celery_config`` under the settings of the closest ``@pytest.mark.celery``."""
    mark = request.node.get_closest_marker("celery")
    return {**celery_config, **(mark.kwargs if mark else {})}


@pytest.fixture(scope="session")
def use_celery_app_trap() -> bool:
    """Override to return True: any use of the current or default app raises."""
    return False


@pytest.fixture(scope="session")
def celery_session_app(request: pytest.FixtureRequest, celery_config: Mapping[str, Any],
                       celery_parameters: Mapping[str, Any], celery_enable_logging: bool,
                       use_celery_app_trap: bool) -> Iterator[Celery]:
    """One app for the whole run (the current and default app unless trapped)."""
    with _create_app(enable_logging=celery_enable_logging, use_trap=use_celery_app_trap,
                     parameters=celery_parameters,
                     **_config(request, celery_config)) as app:
        if not use_celery_app_trap:
            app.set_default()
            app.set_current()
        yield app


@pytest.fixture(scope="session")
def celery_session_worker(request: pytest.FixtureRequest, celery_session_app: Celery,
                          celery_includes: Sequence[str], celery_class_tasks: Sequence[Any],
                          celery_worker_pool: str,
                          celery_worker_parameters: Mapping[str, Any],
                          ) -> Iterator[worker.TestWorkController | None]:
    """A worker for ``celery_session_app`` that lives for the whole run."""
    if NO_WORKER:
        yield None
        return
    for module in celery_includes:
        celery_session_app.loader.import_task_module(module)
    for class_task in celery_class_tasks:
        celery_session_app.register_task(class_task)
    with worker.start_worker(celery_session_app, pool=celery_worker_pool,
                             **celery_worker_parameters) as controller:
        yield controller


@pytest.fixture(scope="session")
def celery_enable_logging() -> bool:
    """Override to return True to keep the app's own logging set-up."""
    return False


@pytest.fixture(scope="session")
def celery_includes() -> Sequence[str]:
    """Override with the modules the workers import first (task modules, signal receivers)."""
    return ()


@pytest.fixture(scope="session")
def celery_worker_pool() -> str:
    """Override to choose the workers' pool: ``"solo"`` (the default) or ``"threads"``."""
    return "solo"


@pytest.fixture(scope="session")
def celery_config() -> Mapping[str, Any]:
    """Override with the settings of the test apps (a Postgres ``broker_url`` here picks the
    test database)."""
    return {}


@pytest.fixture(scope="session")
def celery_parameters() -> Mapping[str, Any]:
    """Override with keyword arguments for the test apps' ``Celery(...)``."""
    return {}


@pytest.fixture(scope="session")
def celery_worker_parameters() -> Mapping[str, Any]:
    """Override with keyword arguments for ``start_worker`` (``queues``, ``concurrency``,
    ``shutdown_timeout``, ``perform_ping_check``, ...)."""
    return {}


@pytest.fixture()
def celery_app(request: pytest.FixtureRequest, celery_config: Mapping[str, Any],
               celery_parameters: Mapping[str, Any], celery_enable_logging: bool,
               use_celery_app_trap: bool) -> Iterator[Celery]:
    """A fresh app for this test, on the test database (not made current)."""
    with _create_app(enable_logging=celery_enable_logging, use_trap=use_celery_app_trap,
                     parameters=celery_parameters,
                     **_config(request, celery_config)) as app:
        yield app


@pytest.fixture(scope="session")
def celery_class_tasks() -> Sequence[Any]:
    """Override with class-based tasks to register on ``celery_session_app``."""
    return []


@pytest.fixture()
def celery_worker(request: pytest.FixtureRequest, celery_app: Celery,
                  celery_includes: Sequence[str], celery_worker_pool: str,
                  celery_worker_parameters: Mapping[str, Any],
                  ) -> Iterator[worker.TestWorkController | None]:
    """A worker for ``celery_app`` in a thread, stopped when the test returns."""
    if NO_WORKER:
        yield None
        return
    for module in celery_includes:
        celery_app.loader.import_task_module(module)
    with worker.start_worker(celery_app, pool=celery_worker_pool,
                             **celery_worker_parameters) as controller:
        yield controller


@pytest.fixture()
def depends_on_current_app(celery_app: Celery) -> None:
    """Make ``celery_app`` the current app for this test."""
    celery_app.set_current()
