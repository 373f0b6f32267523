"""Django's task framework (``django.tasks``, Django 6.0+) on akadze.

Settings::

    TASKS = {"default": {"BACKEND": "akadze_core.contrib.django.AkadzeBackend"}}

Worker, from the project's root with ``DJANGO_SETTINGS_MODULE`` set::

    akadze worker akadze_core.contrib.django:app

``app`` (and ``apps.<alias>`` for another ``TASKS`` alias) is read on first use: it runs
``django.setup()``, imports the ``tasks`` module of every installed app and the backend's
``OPTIONS["MODULES"]``, and answers that backend's akadze ``App``, whose tasks are the Django
tasks those imports defined, for that backend and every other ``AkadzeBackend`` on the same
database (they share its jobs table, and maybe its queues).
"""

from __future__ import annotations

import importlib
from typing import Any

import django
from django.conf import settings
from django.tasks import task_backends
from django.utils.module_loading import autodiscover_modules

from ...app import App
from .backend import (
    ENQUEUE_MODES,
    IN_TRANSACTION,
    NOW,
    ON_COMMIT,
    AkadzeBackend,
    AkadzeTask,
    database_conninfo,
    result_of,
)


def app_for(alias: str = "default") -> App:
    """The akadze ``App`` of ``TASKS[alias]`` (an ``AkadzeBackend``), with Django set up
    and the tasks of every installed app's ``tasks`` module (and ``OPTIONS["MODULES"]``)
    registered, those of the other akadze backends on the same database too: what a
    worker runs."""
    django.setup()
    backend = task_backends[alias]
    if not isinstance(backend, AkadzeBackend):
        raise TypeError(f"TASKS[{alias!r}] is a {type(backend).__name__}, not an "
                        "akadze_core.contrib.django.AkadzeBackend")
    autodiscover_modules("tasks")
    for name in backend.modules:
        importlib.import_module(name)
    app = backend.app
    # The other akadze backends on the same database put their jobs in the same table, and
    # maybe the same queues: this worker runs their tasks too, with their own settings.
    where = backend.queue_database()
    for other_alias in settings.TASKS:
        other = task_backends[other_alias]
        if other is not backend and isinstance(other, AkadzeBackend) \
                and other.queue_database() == where:
            for name in other.modules:
                importlib.import_module(name)
            other.add_tasks_to(app)
    return app


class _Apps:
    """``apps.<alias>``: ``app_for(alias)``, for ``akadze worker MODULE:apps.emails``."""

    def __getattr__(self, alias: str) -> App:
        if alias.startswith("__"):
            raise AttributeError(alias)
        return app_for(alias)


#: ``apps.<alias>``: the akadze App of another ``TASKS`` alias (``app_for``).
apps = _Apps()


def __getattr__(name: str) -> Any:
    # ``app`` is made when asked for, not at import: importing this module is what Django
    # does to load the backend, long before a worker would set Django up.
    if name == "app":
        return app_for("default")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ENQUEUE_MODES", "IN_TRANSACTION", "NOW", "ON_COMMIT", "AkadzeBackend", "AkadzeTask",
           "app_for", "apps", "database_conninfo", "result_of"]
