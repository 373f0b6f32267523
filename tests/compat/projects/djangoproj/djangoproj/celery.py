"""The Celery app of djangoproj, configured from Django's settings (CELERY_ namespace)."""

import os
from logging.config import dictConfig

from akadze_compat import Celery
from akadze_compat.signals import setup_logging

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djangoproj.settings")

app = Celery("djangoproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def configure_logging(**kwargs):
    """Use Django's LOGGING instead of the worker's own logging setup."""
    from django.conf import settings

    dictConfig(settings.LOGGING)


@app.task(bind=True, ignore_result=True)
def debug_task(self):
    print(f"Request: {self.request!r}")
