"""A Celery-compatible app for ``akadze-compat -A tests.dashboard.compat_app flower``."""

from akadze_compat import Celery

app = Celery("dashproj")


@app.task
def add(x: int, y: int) -> int:
    """A task, so the app has one."""
    return x + y
