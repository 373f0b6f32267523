"""A small Celery-style project running on akadze_compat: ``python -m examples.celery_project``.

Laid out like a Celery 5 project (``proj/celery.py`` holds the app, ``proj/tasks.py`` the
tasks, ``proj/__init__.py`` imports the app), with the one change a migration makes:
``from celery import ...`` became ``from akadze_compat import ...``.
"""

from .celery import app

__all__ = ("app",)
