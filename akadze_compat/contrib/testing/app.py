"""The app the pytest fixtures make (Celery's ``celery.contrib.testing.app``), on Postgres.

Celery's test app runs on an in-memory broker; this one runs on a real Postgres database,
the test database, found in this order: ``$CELERY_BROKER_URL`` (it beats every setting, as
in Celery), else a Postgres ``broker_url`` in the test's configuration (``celery_config``,
``@pytest.mark.celery``, or ``broker=`` in ``celery_parameters``), else
``$AKADZE_DATABASE_URL``, else the project's embedded Postgres.
A broker URL that is not Postgres (``memory://``, ``redis://``, as Celery test suites set
it) stands for "the test's broker", so it means the test database too. The schema is
applied to that database once per process.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from copy import deepcopy
from typing import Any

from akadze_compat import Celery, _state
from akadze_core import App as CoreApp

# Registers celery.ping on every app, as Celery's TestApp does.
from . import tasks as _tasks  # noqa: F401

__all__ = ["DEFAULT_TEST_CONFIG", "TestApp", "Trap", "database_for_tests", "ensure_schema",
           "set_trap", "setup_default_app"]

#: The settings every test app starts from (a test's own configuration wins). Celery's set,
#: minus its in-memory broker and result backend: both are the test database here.
DEFAULT_TEST_CONFIG: dict[str, Any] = {
    "worker_hijack_root_logger": False,
    "worker_log_color": False,
    "accept_content": {"json"},
    "enable_utc": True,
    "timezone": "UTC",
    "broker_heartbeat": 0,
}

_schema_lock = threading.Lock()
# The databases whose schema this process applied already ("" is the env/embedded one):
# every test gets a fresh app, and migrating for each of them would cost a round of DDL
# checks per test.
_migrated: set[str] = set()


def _is_postgres(url: str) -> bool:
    if "://" not in url:
        return "=" in url  # a libpq "host=... dbname=..." string
    scheme = url.split("://", 1)[0].lower()
    # SQLAlchemy and kombu spellings too: sqla+postgresql://, postgresql+psycopg://.
    return scheme.removeprefix("sqla+").split("+", 1)[0] in ("postgres", "postgresql")


def database_for_tests(broker_url: str | None = None) -> str | None:
    """The database a test app runs on: ``$CELERY_BROKER_URL`` when set (an app reads it
    before any setting, as Celery's does), else ``broker_url`` when it is a Postgres URL,
    else ``$AKADZE_DATABASE_URL``; None means the embedded Postgres."""
    from_env = os.environ.get("CELERY_BROKER_URL")
    if from_env:
        return from_env
    if broker_url and _is_postgres(broker_url):
        return broker_url
    return os.environ.get("AKADZE_DATABASE_URL") or None


def ensure_schema(url: str | None) -> None:
    """Apply the akadze schema to ``url`` (None: the env/embedded database), once per
    process; a database migrated by someone else costs one check."""
    key = url or ""
    with _schema_lock:
        if key in _migrated:
            return
        core = CoreApp(url)
        try:
            core.migrate()
        finally:
            core.close()
        _migrated.add(key)


def TestApp(name: str | None = None, config: Mapping[str, Any] | None = None,
            enable_logging: bool = False, set_as_current: bool = False, log: Any = None,
            backend: Any = None, broker: str | None = None, **kwargs: Any) -> Celery:
    """A ``Celery`` app for a test: ``DEFAULT_TEST_CONFIG`` under ``config`` (as defaults, so
    ``app.conf.update`` in the test still wins), on the test database, schema applied."""
    settings = {**deepcopy(DEFAULT_TEST_CONFIG), **(config or {})}
    if backend is not None:
        settings.pop("result_backend", None)
    url = database_for_tests(broker if broker is not None else settings.get("broker_url"))
    settings["broker_url"] = url
    ensure_schema(url)
    app = Celery(name or "celery.tests", set_as_current=set_as_current, log=log,
                 backend=backend, **kwargs)
    app.add_defaults(settings)
    return app


class Trap:
    """Stands in for the current and default app and raises on any use: a test under the
    trap fails where code falls back to ``current_app`` instead of the app it was given."""

    def __getattr__(self, name: str) -> Any:
        # unittest.mock and asyncio probe these on anything they patch or inspect.
        if name in ("_is_coroutine", "__func__"):
            return None
        raise RuntimeError(f"Test depends on current_app (it read {name!r})")


@contextmanager
def set_trap(app: Celery) -> Iterator[None]:
    """Install the trap as the current and default app for the block."""
    previous_current, previous_default = _state._current_app, _state._default_app
    trap: Any = Trap()
    _state.set_current_app(trap)
    _state.set_default_app(trap)
    try:
        yield
    finally:
        _state.set_current_app(previous_current)  # type: ignore[arg-type]
        _state.set_default_app(previous_default)  # type: ignore[arg-type]


@contextmanager
def setup_default_app(app: Celery, use_trap: bool = False) -> Iterator[None]:
    """Run the block with ``app`` (under the trap if asked), then put the current and default
    apps back as they were and close ``app`` (its database pools)."""
    previous_current, previous_default = _state._current_app, _state._default_app
    try:
        if use_trap:
            with set_trap(app):
                yield
        else:
            yield
    finally:
        _state.set_current_app(previous_current)  # type: ignore[arg-type]
        _state.set_default_app(previous_default)  # type: ignore[arg-type]
        if app is not previous_current:
            app.close()
