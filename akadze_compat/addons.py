"""The Celery add-ons akadze is tested with, and what ``akadze-compat doctor`` says of them.

Each is a package that imports ``celery`` itself; it runs on akadze with the celery alias on
(``akadze_compat.as_celery``). ``migration_guide/third-party.md`` says, for each, what works,
how to turn it on and what differs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ._alias import ENV_VAR, installed

__all__ = ["ADDONS", "Addon", "alias_state", "installed_addons"]

GUIDE = "migration_guide/third-party.md"


@dataclass(frozen=True)
class Addon:
    """One add-on: its distribution (``pip install`` name) and its section in the guide."""

    distribution: str
    title: str
    anchor: str


#: In the order of the guide.
ADDONS = (
    Addon("sentry-sdk", "Sentry (CeleryIntegration)", "sentry"),
    Addon("ddtrace", "Datadog (ddtrace)", "datadog-ddtrace"),
    Addon("newrelic", "New Relic", "new-relic"),
    Addon("opentelemetry-instrumentation-celery", "OpenTelemetry", "opentelemetry"),
    Addon("flower", "Flower", "flower"),
    Addon("django-celery-results", "django-celery-results", "django-celery-results"),
    Addon("django-celery-beat", "django-celery-beat", "django-celery-beat"),
    Addon("celery-redbeat", "celery-redbeat", "celery-redbeat"),
    Addon("django-structlog", "django-structlog", "django-structlog"),
    Addon("celery-progress", "celery-progress", "celery-progress"),
    Addon("celery-singleton", "celery-singleton", "celery-singleton-and-celery-once"),
    Addon("celery-once", "celery-once", "celery-singleton-and-celery-once"),
)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def installed_addons() -> list[dict[str, Any]]:
    """The add-ons installed in this environment: distribution, version, guide section."""
    found = []
    for addon in ADDONS:
        version = _version(addon.distribution)
        if version is not None:
            found.append({"distribution": addon.distribution, "version": version,
                          "title": addon.title, "guide": f"{GUIDE}#{addon.anchor}"})
    return found


def alias_state() -> dict[str, Any]:
    """Whether ``celery`` resolves to akadze_compat in this process, what ``AKADZE_CELERY``
    says, and the real celery installed beside akadze, if any (unused while the alias is
    on)."""
    module = sys.modules.get("celery")
    spec = getattr(module, "__spec__", None)
    return {"on": installed(), "env": os.environ.get(ENV_VAR),
            "celery_is": getattr(spec, "name", None) if module is not None else None,
            "real_celery": _version("celery")}
