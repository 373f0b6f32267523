"""A Celery-compatible app for ``akadze-compat -A tests.dashboard.compat_app flower``."""

import time

from akadze_compat import Celery

app = Celery("dashproj")


@app.task
def add(x: int, y: int) -> int:
    """A task, so the app has one."""
    return x + y


@app.task
def nap(seconds: float) -> float:
    """Sleep: a running task for the terminate action and the worker controls."""
    time.sleep(seconds)
    return seconds
