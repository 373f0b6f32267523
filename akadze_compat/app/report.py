"""``app.bugreport()`` and the ``report`` inspect command: Celery's bug-report text.

The same sections as Celery's (software, platform, loader, settings, then the changed
settings with secrets masked), naming what runs here: the Celery API version the facade
follows, akadze's and psycopg's versions, the queue's database as the transport and the job
rows as the result store.
"""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["CELERY_API_VERSION", "bugreport"]

#: The Celery release whose API the facade follows.
CELERY_API_VERSION = "5.7.0"


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"


def bugreport(app: Any) -> str:
    """Celery's ``bugreport`` text for ``app``."""
    loader = type(app.loader)
    arch = ", ".join(part for part in platform.architecture() if part)
    return (
        f"\nsoftware -> celery:{CELERY_API_VERSION} (akadze {_version('akadze')}) "
        f"psycopg:{_version('psycopg')} py:{platform.python_version()}\n"
        f"platform -> system:{platform.system()} arch:{arch}\n"
        f"            kernel version:{platform.release()} "
        f"imp:{platform.python_implementation()}\n"
        f"loader   -> {loader.__module__}.{loader.__qualname__}\n"
        "settings -> transport:postgresql results:akadze (the job rows)\n\n"
        f"{app.conf.humanize()}\n")
