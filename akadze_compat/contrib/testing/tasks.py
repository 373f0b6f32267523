"""The task the embedded test worker runs to prove it is consuming (Celery's ``celery.ping``).

It is a shared task, so importing this module adds it to every app, as in Celery.
"""

from __future__ import annotations

from akadze_compat import shared_task

__all__ = ["ping"]


@shared_task(name="celery.ping")
def ping() -> str:
    """Return ``"pong"``."""
    return "pong"
