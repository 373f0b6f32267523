"""Importing task modules: ``imports``/``include``, ``autodiscover_tasks``, Django apps."""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import signals

if TYPE_CHECKING:
    from .app.base import Celery

__all__ = ["Loader", "django_app_names", "find_related_module"]


def find_related_module(package: str, related_name: str | None) -> Any:
    """Import ``package.related_name`` (None when that module does not exist)."""
    try:
        module = importlib.import_module(package)
        if not related_name and module:
            return module
    except ModuleNotFoundError:
        # INSTALLED_APPS may name an AppConfig class: walk up one level.
        package = package.rpartition(".")[0]
        if not package:
            raise
    module_name = f"{package}.{related_name}"
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None
        raise


def django_app_names() -> list[str]:
    """Django's installed apps, when Django is configured (Celery's Django fix-up)."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        return []
    try:
        import django
        from django.apps import apps
    except ImportError:
        return []
    if not apps.ready:
        django.setup()
    return [config.name for config in apps.get_app_configs()]


class Loader:
    """Imports the task modules (Celery's ``app.loader``)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.task_modules: set[str] = set()

    def import_task_module(self, module: str) -> Any:
        """Import one task module."""
        self.task_modules.add(module)
        return importlib.import_module(module)

    def autodiscover_tasks(self, packages: Iterable[str], related_name: str | None = "tasks") \
            -> list[Any]:
        """Import ``<package>.<related_name>`` for every package that has one."""
        found = [find_related_module(package, related_name) for package in packages]
        self.task_modules.update(module.__name__ for module in found if module)
        return found

    def import_default_modules(self) -> list[Any]:
        """What a worker imports at start: ``imports``, ``include``, autodiscovered modules."""
        if os.environ.get("DJANGO_SETTINGS_MODULE"):
            django_app_names()  # runs django.setup() before any task module is imported
        conf = self.app.conf
        names = [*_as_list(conf.imports), *_as_list(conf.include)]
        modules = [self.import_task_module(name) for name in names]
        signals.import_modules.send(sender=self.app)
        modules.extend(self.app.run_pending_autodiscovery())
        return modules


def _as_list(value: Any) -> list[str]:
    if not value:
        return []
    return [value] if isinstance(value, str) else list(value)
