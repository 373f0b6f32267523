"""The Celery app of djbeatproj, configured from Django's settings (CELERY_ namespace)."""

import os

from akadze_compat import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")

app = Celery("beatproj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
