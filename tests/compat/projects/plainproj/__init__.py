"""plainproj: a typical Celery 5 project; `celery` is imported as `akadze_compat`."""

# Load the app when Django-less code imports the package, as Celery's docs recommend.
from .celery import app as celery_app

__all__ = ("celery_app",)
