"""Celery's backend selection (``celery.app.backends``): a ``result_backend`` name to a class.

Celery resolves ``result_backend`` to a class by alias (``redis``, ``db``...), by a name a
package registers (the ``celery.result_backends`` entry points: django_celery_results'
``django-db`` and ``django-cache``), by the loader's ``override_backends`` or by a dotted
path. The same names resolve here, for code that asks. Results themselves stay in the job
rows whatever the setting names (``app.backend``): Celery's own stores have no
implementation here, so their aliases give the facade's ``DatabaseBackend``, and
``disabled`` gives ``DisabledBackend``. A package's or a project's class named by the
configuration is imported (configuration, not a stored value).
"""

from __future__ import annotations

import importlib
import types
from importlib.metadata import entry_points
from typing import Any

from ..backends.classes import DisabledBackend
from ..backends.database import DatabaseBackend
from ..exceptions import ImproperlyConfigured

__all__ = ["BACKEND_ALIASES", "by_name", "by_url"]

#: Celery 5.7's aliases of its own result stores: results live in the job rows here.
BACKEND_ALIASES: dict[str, Any] = {
    name: DatabaseBackend for name in (
        "rpc", "cache", "redis", "rediss", "sentinel", "mongodb", "db", "database",
        "elasticsearch", "cassandra", "couchbase", "couchdb", "cosmosdbsql", "riak", "file",
        "consul", "dynamodb", "azureblockblob", "arangodb", "s3", "gs")}
BACKEND_ALIASES["disabled"] = DisabledBackend

UNKNOWN_BACKEND = "Unknown result backend: {0!r}.  Did you spell that correctly? ({1!r})"


def _extension_names(namespace: str) -> dict[str, str]:
    """The ``name = module:attr`` entry points of ``namespace`` (Celery's
    ``load_extension_class_names``)."""
    return {point.name: point.value for point in entry_points(group=namespace)}


def _symbol(path: str) -> Any:
    """``module:attr`` or ``module.attr``, imported."""
    module_name, colon, attr = path.partition(":")
    if not colon:
        module_name, _, attr = path.rpartition(".")
    if not module_name:
        raise ValueError(f"not a dotted path: {path!r}")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


def by_name(backend: Any = None, loader: Any = None,
            extension_namespace: str = "celery.result_backends") -> Any:
    """The backend class ``backend`` names (``disabled`` when None), as Celery finds it."""
    backend = backend or "disabled"
    if not isinstance(backend, str):
        return backend  # a class given as is
    aliases: dict[str, Any] = dict(BACKEND_ALIASES)
    aliases.update(getattr(loader, "override_backends", None) or {})
    aliases.update(_extension_names(extension_namespace))
    found = aliases.get(backend, backend)
    try:
        cls = _symbol(found) if isinstance(found, str) else found
    except (ImportError, AttributeError, ValueError) as exc:
        raise ImproperlyConfigured(UNKNOWN_BACKEND.format(backend, str(exc))) from exc
    if isinstance(cls, types.ModuleType):
        raise ImproperlyConfigured(UNKNOWN_BACKEND.format(
            backend, "is a Python module, not a backend class."))
    return cls


def by_url(backend: Any = None, loader: Any = None) -> tuple[Any, str | None]:
    """The class and URL of ``backend`` (``scheme://...``, ``scheme+url``), as Celery."""
    url = None
    if isinstance(backend, str) and "://" in backend:
        url = backend
        scheme, _, _ = url.partition("://")
        if "+" in scheme:
            backend, url = url.split("+", 1)
        else:
            backend = scheme
    return by_name(backend, loader), url
